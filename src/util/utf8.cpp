#include "util/utf8.h"

namespace depcache {

size_t utf8_char_len(const unsigned char* p, size_t avail, size_t* prefix, bool* incomplete) {
  const unsigned char b = p[0];
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;  // no overlong forms
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  }
  size_t k = 0;
  if (need > 0)
    for (; k < need && 1 + k < avail; ++k) {
      const unsigned char c = p[1 + k];
      if (c < (k == 0 ? lo : 0x80) || c > (k == 0 ? hi : 0xBF)) break;
    }
  if (need > 0 && k == need) return need + 1;
  if (prefix) *prefix = 1 + k;
  if (incomplete) *incomplete = need > 0 && 1 + k == avail;
  return 0;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const size_t n = utf8_char_len(p, s.size() - i);
  if (n == 0) {
    ++i;
    return 0xFFFD;
  }
  i += n;
  if (n == 1) return p[0];
  uint32_t cp = p[0] & (0x7F >> (n + 1));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (p[k] & 0x3F);
  return cp;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string_view::npos; pos = hit + from.size())
    out.append(s.substr(pos, hit - pos)).append(to);
  return out.append(s.substr(pos));
}

std::string spm_normalized(std::string_view text, bool prefix) {
  std::string s = replace_all(text, " ", kSpaceMark);
  if (prefix) s.insert(0, kSpaceMark);
  return s;
}

}  // namespace depcache
