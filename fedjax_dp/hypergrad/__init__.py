"""Hyper-gradients through the federated round: the round as a differentiable function of its
scalar settings (client and server learning rates, per-step weights) and their online adaptation
(Rush, Charles and Garrett, "Federated automatic differentiation", TMLR 2024; Baydin et al. 2018,
"Online learning rate adaptation with hypergradient descent", ICLR)."""

from fedjax_dp.hypergrad import config  # noqa: F401  (registers the hypergrad section)
from fedjax_dp.hypergrad.differentiable import (
    SETTINGS,
    Hypertuned,
    held_out_loss,
    hypergradient,
    initial_settings,
    server_step_hypergradient,
    step_scales,
)
from fedjax_dp.hypergrad.online import HyperOptions, OnlineHypertuned

__all__ = [
    "HyperOptions",
    "OnlineHypertuned",
    "SETTINGS",
    "Hypertuned",
    "held_out_loss",
    "hypergradient",
    "initial_settings",
    "server_step_hypergradient",
    "step_scales",
]
