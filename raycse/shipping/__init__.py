"""Shipping a trained model: ``raycse export`` writes it as files that run without PyTorch (ONNX, int8 ONNX,
OpenVINO), checks that they embed what the model embeds, and puts their scores in its card."""
