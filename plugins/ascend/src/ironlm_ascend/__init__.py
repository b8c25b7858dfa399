"""ironlm-ascend: the Huawei Ascend NPU platform plugin for IronLM (through torch_npu)."""
