"""Presentation: how a job, its history and its decisions read, to people and as JSON,
shared by the CLI, the API, the console and the demo."""
