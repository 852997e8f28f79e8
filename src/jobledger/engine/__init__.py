"""The engine: the composition root and the facade's parts over it."""
