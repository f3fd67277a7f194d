#pragma once
// The remote tier as the index layers it on match and insert. The store is
// shared between processes and content-addressed: a sequence is cut into
// blocks of block_tokens, each filed under the hash of its namespace and
// every token up to the block's end, so a process that computed the same
// prefix (in the same context) finds it. New KV is published block by block
// as it is inserted; a match that ends early reads the following blocks.
// A store that fails only makes matches shorter; a corrupt record is
// deleted and ends the read there.
#include <cstdint>
#include <functional>
#include <span>

#include "kv/kv_span.h"
#include "kv/remote_store.h"

namespace depcache {

class RemoteBlocks {
 public:
  RemoteBlocks(RemoteStore& store, int64_t block_tokens);
  int64_t block_tokens() const { return block_tokens_; }

  // Publishes the blocks that hold tokens [from, n) of the sequence (the
  // first may start before `from`); make(b0, b1) gives a block's span.
  // Returns the blocks offered.
  int64_t publish(uint64_t ns, std::span<const int32_t> tokens, int64_t from, const SpanMaker& make);
  // Reads the blocks after the first `length` tokens in order, handing each
  // to take(b0, b1, span) (tokens [b0, b1) of the sequence), until one is
  // missing or corrupt (*dropped counts those deleted) or take refuses it.
  // Returns the length reached.
  int64_t fetch(uint64_t ns, std::span<const int32_t> tokens, int64_t length,
                const std::function<bool(int64_t b0, int64_t b1, const KvSpan& span)>& take,
                int64_t* dropped);

 private:
  RemoteStore& store_;
  int64_t block_tokens_;
};

}  // namespace depcache
