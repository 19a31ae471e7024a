// What tokenizer_test.cpp and tokenizer_reference_test.cpp both check: a tokenizer's
// encodings and decodings of each text equal the reference's (tokenizer_reference.mjs's
// output: per text its ids, ids with the special tokens, and both decodings).
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hf/tokenizer.h"

namespace tandem::hf {

inline void expectLikeReference(const Tokenizer& t, const nlohmann::json& reference) {
  for (const auto& e : reference) {
    const auto text = e["text"].get<std::string>();
    SCOPED_TRACE(text);
    const std::vector<int32_t> ids = t.encode(text);
    EXPECT_EQ(ids, e["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(t.encode(text, true), e["with_special"].get<std::vector<int32_t>>());
    EXPECT_EQ(t.decode(ids), e["decoded"].get<std::string>());
    EXPECT_EQ(t.decode(ids, true), e["decoded_skipping"].get<std::string>());
  }
}

}  // namespace tandem::hf
