#!/usr/bin/env bash
# receive one part of the payload (wheels + GGUF) into /root/w; idempotent
mkdir -p /root/w && cp .p*/part0* /root/w/ && ls -la /root/w
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))"
python3 -c "import torch.distributed.run" && echo torchrun ok
