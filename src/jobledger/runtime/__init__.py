"""The process: the supervisor and the runners that configure it."""
