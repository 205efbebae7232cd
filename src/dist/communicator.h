// The collective-communication seam of the forward pass (ARCHITECTURE rule 7). Every forward takes a
// Communicator even on one GPU; at world size 1 the collectives are no-ops, so the single-device
// path pays nothing and the multi-rank path (NCCL/RCCL, a later issue) plugs in without touching
// the model code.
#pragma once

#include "core/tensor.h"

namespace mla::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In place: x <- sum over ranks of x (F32). Called after row-parallel projections (o_proj, MoE).
  virtual void all_reduce_sum(const TensorView& x) = 0;
};

// World size 1: every collective is the identity.
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_reduce_sum(const TensorView&) override {}
};

// Which slice of the model a rank holds: attention heads split evenly (tensor parallel), routed
// experts split into contiguous ranges (expert parallel). World size 1 holds everything.
struct ParallelPlan {
  int rank = 0;
  int world_size = 1;
  int heads_begin(int num_heads) const { return num_heads / world_size * rank; }
  int local_heads(int num_heads) const { return num_heads / world_size; }
  bool holds_expert(int expert, int num_experts) const {
    const int per_rank = (num_experts + world_size - 1) / world_size;
    return expert / per_rank == rank;
  }
};

}  // namespace mla::dist
