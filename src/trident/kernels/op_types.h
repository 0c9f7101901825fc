// The op headers whose argument types the op list (kernels/ops.inc) names, and the list's helper
// macro: what cpu/cpu_ops.h, cuda/cuda_ops.h and dispatch.h include before expanding the list.
// INTERNAL TO kernels/ (through those headers).
#pragma once

#include <cstdint>

#include "trident/core/bf16.h"
#include "trident/core/exec_context.h"
#include "trident/kernels/adamw.h"
#include "trident/kernels/attention.h"
#include "trident/kernels/bf16.h"
#include "trident/kernels/cross_entropy.h"
#include "trident/kernels/document_ids.h"
#include "trident/kernels/dropout.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/embedding.h"
#include "trident/kernels/fill.h"
#include "trident/kernels/flash_attention.h"
#include "trident/kernels/flash_attention_block.h"
#include "trident/kernels/fused_bias_gelu.h"
#include "trident/kernels/fused_residual_layernorm.h"
#include "trident/kernels/init_normal.h"
#include "trident/kernels/kv_cache_attention.h"
#include "trident/kernels/layernorm.h"
#include "trident/kernels/lion.h"
#include "trident/kernels/moe.h"
#include "trident/kernels/overflow.h"
#include "trident/kernels/rmsnorm.h"
#include "trident/kernels/rope.h"
#include "trident/kernels/swiglu.h"
#include "trident/kernels/vocab_parallel_cross_entropy.h"

// (a, b, c) -> a, b, c: an op's parameter list, written in parentheses in ops.inc.
#define TRIDENT_KERNEL_UNPAREN(...) __VA_ARGS__
