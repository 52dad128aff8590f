// The emulator's stand-in for CUDA's header (see ../cuda_on_host.h).
#pragma once
#include "../cuda_on_host.h"
