"""Tests run with one torch thread: the CI machine has 2 cores."""

import torch

torch.set_num_threads(1)
