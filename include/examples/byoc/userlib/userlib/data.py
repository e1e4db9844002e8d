"""Fixed-length blocks of the bytes of a folder's text files (a vocabulary of 256: no tokenizer to train)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset


class ByteBlocks(Dataset):
    """Blocks of `block_size` bytes of every *.txt file under `data_dir`; the labels are the inputs."""

    vocab_size = 256

    def __init__(self, data_dir: str, block_size: int = 64) -> None:
        files = sorted(Path(data_dir).rglob("*.txt"))
        if not files:
            raise SystemExit(f"no *.txt files under {data_dir}")
        self.files = files
        data = torch.tensor(list(b"".join(f.read_bytes() for f in files)), dtype=torch.long)
        if len(data) < block_size:
            data = data.repeat(block_size // len(data) + 1)
        self.blocks = data[: (len(data) // block_size) * block_size].view(-1, block_size)

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        block = self.blocks[index]
        return {"input_ids": block, "labels": block.clone()}
