"""The process's life: start-up, launching the work (pinned here, or in node mode's supervised
workers), stop requests, and exit."""
