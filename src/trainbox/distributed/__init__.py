"""The process group and deciding together: joining, agreeing with peers, one verdict for all."""
