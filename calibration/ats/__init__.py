"""Adaptive Temperature Scaling (Xie et al., 2024, arXiv 2409.19817): a calibration head on a frozen causal LM.

The head reads the model's last hidden states and predicts a log-temperature per token; token i's logits are
divided by tau_i, i.e. its hidden row is scaled by 1 / tau_i, so ranking never changes and the loss runs through
``kernels.linear_cross_entropy`` without the (N, V) logits. Files: ``config`` (settings), ``head`` (the module and
its save / load), ``loss`` (selective smoothing through the kernel, and its materialised reference), ``train``
(the loop on a frozen model). Import from the submodules: this package imports none, so a config that reads
``config`` stays light.
"""
