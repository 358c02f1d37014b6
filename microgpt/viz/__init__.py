"""What is drawn and logged: the attention maps and plots (draw), the TensorBoard logger
(tensorboard).
"""
