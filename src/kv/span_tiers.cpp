#include "kv/span_tiers.h"

#include "kv/span_record.h"

namespace depcache {

SpanSlot SpanSlot::take_front(int64_t at) {
  SpanSlot head;
  head.n_tokens = at;
  head.bytes_per_token = bytes_per_token;
  head.tier = tier;
  if (span.n_tokens() > 0) {
    head.span = span.slice(0, at);
    span = span.slice(at, span.n_tokens());
  }
  head.has_host_copy = has_host_copy;
  if (host_copy.n_tokens() > 0) {
    head.host_copy = host_copy.slice(0, at);
    host_copy = host_copy.slice(at, host_copy.n_tokens());
  }
  n_tokens -= at;
  return head;
}

std::optional<Tier> SpanTiers::below(Tier t) const {
  if (t == Tier::Hot && host_) return Tier::Host;
  if ((t == Tier::Hot || t == Tier::Host) && disk_) return Tier::Disk;
  return std::nullopt;
}

void SpanTiers::remove(SpanSlot& s) {
  drop_host_copy(s);
  bytes_[static_cast<int>(s.tier)] -= s.tier_bytes();
  if (s.tier == Tier::Disk && disk_ && s.disk_bytes > 0) disk_->remove(s.disk_key);
}

void SpanTiers::set_tier(SpanSlot& s, Tier t, const std::function<void(SpanSlot&)>& change) {
  bytes_[static_cast<int>(s.tier)] -= s.tier_bytes();
  s.tier = t;
  if (change) change(s);
  bytes_[static_cast<int>(t)] += s.tier_bytes();
}

void SpanTiers::drop_host_copy(SpanSlot& s) {
  if (!s.has_host_copy) return;
  bytes_[static_cast<int>(Tier::Host)] -= s.memory_bytes();
  s.host_copy = KvSpan();
  s.has_host_copy = false;
}

size_t SpanTiers::swap_out(SpanSlot& s) {
  if (s.has_host_copy) {  // the copy becomes the slot's span: nothing moves
    bytes_[static_cast<int>(Tier::Host)] -= s.memory_bytes();
    set_tier(s, Tier::Host, [](SpanSlot& slot) {
      if (slot.host_copy.n_tokens() > 0) slot.span = std::move(slot.host_copy);
      slot.host_copy = KvSpan();
      slot.has_host_copy = false;
    });
    return 0;
  }
  set_tier(s, Tier::Host, [](SpanSlot& slot) {
    if (slot.span.n_tokens() > 0) slot.span = KvSpan(slot.span);
  });
  return s.memory_bytes();
}

bool SpanTiers::promote(SpanSlot& s, uint64_t ns, std::span<const int32_t> path, int64_t start,
                        int64_t* promoted_bytes) {
  if (s.tier == Tier::Hot) return true;
  if (s.tier == Tier::Host && swap_out_once_) {
    set_tier(s, Tier::Hot, [](SpanSlot& slot) {
      if (slot.span.n_tokens() > 0) {
        slot.host_copy = std::move(slot.span);
        slot.span = KvSpan(slot.host_copy);
      }
      slot.has_host_copy = true;
    });
    bytes_[static_cast<int>(Tier::Host)] += s.memory_bytes();
    *promoted_bytes += static_cast<int64_t>(s.memory_bytes());
    return true;
  }
  if (s.tier == Tier::Host || s.is_virtual() || !disk_) {
    // Host to hot is a copy in the papers' setting (host to GPU memory); it
    // is done for real, so its cost shows in the time to first token.
    if (s.span.n_tokens() > 0) s.span = KvSpan(s.span);
    if (s.tier == Tier::Host) *promoted_bytes += static_cast<int64_t>(s.memory_bytes());
    set_tier(s, Tier::Hot);
    return true;
  }
  const uint64_t key = s.disk_key;
  std::optional<KvSpan> span = disk_->get(key, ns, path, start);
  return span && adopt(s, key, std::move(*span), promoted_bytes);
}

std::optional<DiskSpanStore::LayerReader> SpanTiers::open_disk(const SpanSlot& s, uint64_t ns,
                                                               std::span<const int32_t> path, int64_t start) {
  if (s.tier != Tier::Disk || s.is_virtual() || !disk_) return std::nullopt;
  std::optional<DiskSpanStore::LayerReader> reader = disk_->open_layers(s.disk_key, ns, path, start);
  if (!reader || reader->span().n_tokens() != s.n_tokens) return std::nullopt;
  return reader;
}

std::shared_ptr<LayerLoader> SpanTiers::start_layered(const SpanSlot& s, uint64_t ns,
                                                      std::span<const int32_t> path, int64_t start,
                                                      const std::function<int(int n_layer)>& preload) {
  std::optional<DiskSpanStore::LayerReader> reader = open_disk(s, ns, path, start);
  if (!reader) return nullptr;
  const int depth = preload(reader->n_layer());
  return std::make_shared<LayerLoader>(std::move(*reader), depth);
}

bool SpanTiers::adopt(SpanSlot& s, uint64_t disk_key, KvSpan span, int64_t* promoted_bytes) {
  if (s.tier != Tier::Disk || s.disk_key != disk_key || span.n_tokens() != s.n_tokens || s.n_tokens == 0)
    return false;
  if (disk_) disk_->remove(disk_key);  // the hot copy is the slot's span now
  set_tier(s, Tier::Hot, [&](SpanSlot& slot) {
    slot.disk_bytes = 0;
    slot.span = std::move(span);
    slot.bytes_per_token = slot.span.bytes() / static_cast<size_t>(slot.n_tokens);
  });
  *promoted_bytes += static_cast<int64_t>(s.memory_bytes());
  return true;
}

bool SpanTiers::write_to_disk(SpanSlot& s, uint64_t ns, std::span<const int32_t> path, int64_t start) {
  if (s.span.n_tokens() == 0) {
    set_tier(s, Tier::Disk);
    return true;
  }
  const uint64_t key = span_content_key(ns, path);
  const size_t need = disk_file_bytes(s, static_cast<int64_t>(path.size()));
  if (!disk_) return false;
  if (!disk_->put(key, ns, path, start, std::move(s.span))) return false;
  set_tier(s, Tier::Disk, [&](SpanSlot& slot) {
    slot.disk_key = key;
    slot.disk_bytes = need;
    slot.span = KvSpan();
    slot.bytes_per_token = 0;
  });
  return true;
}

}  // namespace depcache
