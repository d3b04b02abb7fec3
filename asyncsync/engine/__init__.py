"""The engine: implements the SDK's ports (store, worker context) and runs a protocol.

Modules, one concept each: settings (the server's settings), compute (the compute seam),
store (global model and versions), membership (who is in the run, rejoin bookkeeping),
checkpoint, evaluation, lifecycle (budget, stop, status), core (request validation and
dispatch), channel (what a worker needs of a transport), worker (Worker and its context).
The one clock they all read is `asyncsync.clock`, below the engine.
"""
