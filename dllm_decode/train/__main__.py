"""``python -m dllm_decode.train --family llada --out DIR ...`` (same flags as ``train tiny``)."""

import sys

from dllm_decode.train.trainer import train_tiny_main

if __name__ == "__main__":
    sys.exit(train_tiny_main(sys.argv[1:]))
