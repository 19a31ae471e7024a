// What the cross-process pair implementations (socket_pairs.h, zmq_pairs.h) share: the
// rank, the group's size, and the codec their values travel in (raw fp32, fp16 or bf16;
// received values are decoded and accumulated in fp32).
#pragma once

#include "core/comm/pairs.h"
#include "core/error.h"
#include "transport/codec.h"

namespace tandem::transport {

class CodecPairs : public Pairs {
 public:
  CodecPairs(int rank, int size, Codec codec) : codec_(codec), rank_(rank), size_(size) {
    TANDEM_CHECK_MSG(size >= 1 && rank >= 0 && rank < size, InvalidArgument,
                     "group: rank " << rank << " of " << size);
    TANDEM_CHECK_MSG(codec != Codec::kI8, InvalidArgument,
                     "group: int8 chunks are not supported (fp32, fp16 or bf16)");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void asSent(std::span<float> x) const override { roundTrip(codec_, x); }

 protected:
  std::string rankName(int rank) const { return tandem::rankName(rank, size_); }

  const Codec codec_;
  const int rank_, size_;
};

}  // namespace tandem::transport
