"""What is drawn and logged: attention maps and plots (draw), the TensorBoard logger."""
