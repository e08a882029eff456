"""What watches a run besides training itself: the stop vote and the hang watchdog's marks,
the step metrics and their sinks, and the progress line."""
