"""The performance model: predicted epoch time and bytes of a configuration at any P, without running it."""
