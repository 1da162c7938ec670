"""The Megatron-Core train engine (``train.backend=megatron``; needs ``loongsage-core[megatron]``)."""
