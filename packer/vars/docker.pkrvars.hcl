# Docker defaults: `make image PROVIDER=docker` (the cpu profile from the local Debian base;
# make passes docker_base_image, and on the gpu profile NVIDIA's CUDA/cuDNN image with
# docker_pull = true).
profile     = "cpu"
docker_pull = false
