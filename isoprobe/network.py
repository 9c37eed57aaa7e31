"""Whether a hub can be reached, decided fast, so offline runs fail or fall back at once."""

from __future__ import annotations

import os
import socket

HF_HOST = "huggingface.co"


def hf_offline_requested() -> bool:
    """True when the user asked Hugging Face libraries to stay offline."""
    flags = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(f, "").strip().lower() in {"1", "true", "yes"} for f in flags)


def host_reachable(host: str = HF_HOST, port: int = 443, timeout: float = 3.0) -> bool:
    """Open (and close) one TCP connection to ``host:port`` within ``timeout`` seconds."""
    if hf_offline_requested() and host == HF_HOST:
        return False
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
