#pragma once
// UTF-8 and SentencePiece text helpers shared by the tokenizer and the
// vocabulary learner, so both split and normalise text the same way.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace depcache {

inline constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// Length of the well-formed UTF-8 character at p (Unicode table 3-7), or 0 if
// the bytes there are not one. Then *prefix is the length of the longest valid
// start of a character (at least 1) and *incomplete tells whether the input
// simply ended inside it, so that more bytes could still complete it.
size_t utf8_char_len(const unsigned char* p, size_t avail, size_t* prefix = nullptr,
                     bool* incomplete = nullptr);

void append_utf8(std::string& out, uint32_t cp);

// The character at s[i], moving i past it; a byte that does not start a
// well-formed character reads as U+FFFD and moves i by one.
uint32_t utf8_next(std::string_view s, size_t& i);

std::string replace_all(std::string_view s, std::string_view from, std::string_view to);

// SentencePiece's view of a fragment: spaces as U+2581, one prefixed if asked.
std::string spm_normalized(std::string_view text, bool prefix);

}  // namespace depcache
