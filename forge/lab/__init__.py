"""forge lab: a live gallery of kernels by family (`forge lab`), each run on the device with a picture."""
