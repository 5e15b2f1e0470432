"""Tiny-model training: masked-diffusion objectives, generated task data, the trainer CLI."""

from dllm_decode.train.cli import add_train_subcommands
from dllm_decode.train.config import TrainConfig, build_tiny_model, parse_args
from dllm_decode.train.data import Batch, TaskData
from dllm_decode.train.objectives import (
    LossOutput,
    block_diffusion_loss,
    diffusion_loss,
    masked_diffusion_loss,
    two_stream_mask,
)
from dllm_decode.train.trainer import train, train_tiny_main

__all__ = [
    "Batch", "LossOutput", "TaskData", "TrainConfig", "block_diffusion_loss",
    "build_tiny_model", "diffusion_loss", "masked_diffusion_loss", "parse_args", "train",
    "add_train_subcommands", "train_tiny_main", "two_stream_mask",
]
