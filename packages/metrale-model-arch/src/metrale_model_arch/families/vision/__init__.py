"""What the vision towers share (GLM-5.3's, Qwen2.5-VL's): a prompt's image inputs, the pixel
steps of preprocessing, the fields of ``preprocessor_config.json`` and the axial 2D rotary."""
