"""A module for test_placement: `placement.deferred` imports it in the first phase of a worker's start."""
