"""Small CLI verbs that are not part of a pipeline stage's own module."""
