"""Measurements of the engine that are too slow or too heavy for `make test` (`make soak`, ...)."""
