"The built-in detectors: one module per detector, its tool card (`<id>.yaml`) beside it; found by walking this folder."
