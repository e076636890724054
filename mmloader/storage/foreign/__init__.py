"""Datasets other tools wrote, read in place: Megatron-Energon, img2dataset, and the index built for shards another tool indexed."""
