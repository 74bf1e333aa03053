"""``spikecheck preflight``: will a Hugging Face model config stay stable at scale, and which
defence does it need? (docs/preflight.md)"""
