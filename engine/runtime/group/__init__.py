"""A model served by a group of ranks: rank 0's scheduler, the followers, the doorbells
between them and the pipeline and tensor stages each rank runs."""
