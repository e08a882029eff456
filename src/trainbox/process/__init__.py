"""The process's life: start-up, node-mode supervision, stop requests, and exit."""
