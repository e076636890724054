"""LMDB: one environment per dataset, one named sub-database per field; the process hygiene LMDB needs (fork gate, map trimming)."""
