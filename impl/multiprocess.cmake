# impl/ — one process per GPU: bootstrap (TCP rendezvous, MPI), cross-process memory, tests.
