"""A worker's own math: the flat-vector trainer, its optimizer, models, data, pooled buffers
and device copies. Nothing here knows of protocols, servers or transports."""
