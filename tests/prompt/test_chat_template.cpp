#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "model/gguf.h"
#include "model/model_writer.h"
#include "model/vocab.h"
#include "prompt/chat_template.h"
#include "prompt/jinja_oracle.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

// The prompt text a family's template renders.
std::string render_chat(ChatFamily f, std::span<const ChatMessage> messages, std::string_view bos = "<s>",
                        std::string_view eos = "</s>", std::string_view today = {}) {
  return ChatFormat(f).render(messages, bos, eos, today).text;
}

const std::vector<ChatMessage> kTwoTurns = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Who are you?"}};

// The formats as the families document them, written out by hand.
TEST(ChatTemplate, EveryFamilyFormatsATwoTurnConversation) {
  EXPECT_EQ(render_chat(ChatFamily::ChatML, kTwoTurns),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(ChatFamily::Llama3, kTwoTurns),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render_chat(ChatFamily::Llama2, kTwoTurns),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Who are you? [/INST]");
  EXPECT_EQ(render_chat(ChatFamily::Mistral, kTwoTurns),
            "[INST] Be brief.\n\nHi [/INST]Hello.</s>[INST] Who are you? [/INST]");
  EXPECT_EQ(
      render_chat(ChatFamily::Zephyr, kTwoTurns),
      "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello.</s>\n<|user|>\nWho are you?</s>\n"
      "<|assistant|>\n");
}

TEST(ChatTemplate, Qwen2AddsItsDefaultSystemMessageOnlyWhenThereIsNone) {
  const std::vector<ChatMessage> user_only = {{"user", "Hi"}};
  EXPECT_EQ(render_chat(ChatFamily::Qwen2, user_only),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(ChatFamily::Qwen2, kTwoTurns), render_chat(ChatFamily::ChatML, kTwoTurns));
  EXPECT_EQ(render_chat(ChatFamily::ChatML, user_only),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

// Every family marks exactly the messages' own text (each message's text
// once, whatever the family moves or joins around it) and none of its own
// markup or default system message.
TEST(ChatTemplate, EveryFamilyMarksTheMessagesTextAndNothingElse) {
  const std::vector<ChatMessage> user_only = {{"user", "Hi"}};
  for (const std::string& name : chat_family_names()) {
    const ChatFamily f = *chat_family_from_name(name);
    EXPECT_EQ(chat_family_name(f), name);
    EXPECT_EQ(ChatFormat(f).name(), name);
    for (const auto* conv : {&kTwoTurns, &user_only}) {
      const RenderedChat r = ChatFormat(f).render(*conv, "<BOS>", "<EOS>", "05 Mar 2026");
      std::vector<std::string> marked, contents;
      for (auto [b, e] : r.text_ranges) marked.push_back(r.text.substr(b, e - b));
      for (const ChatMessage& m : *conv) contents.push_back(m.content);
      std::sort(marked.begin(), marked.end());
      std::sort(contents.begin(), contents.end());
      EXPECT_EQ(marked, contents) << name << ": " << r.text;
    }
  }
  EXPECT_EQ(ChatFormat::from_jinja(chat_template_jinja(ChatFamily::ChatML)).name(), "the model's template");
  EXPECT_FALSE(chat_family_from_name("alpaca"));
}

// ---- Against Debian's python3-jinja2 (tests/prompt/render_jinja.py) ----

const std::vector<std::vector<ChatMessage>>& kConversations = test::chat_conversations();
constexpr std::string_view kBos = "<BOS>", kEos = "<EOS>", kToday = "05 Mar 2026";

// Every conversation rendered by jinja2; nullopt where the template refuses it.
std::vector<std::optional<std::string>> jinja_render(const std::string& jinja) {
  const auto out = test::jinja2_render({jinja}, {kConversations});
  if (!out[0]) throw std::runtime_error("jinja2 cannot read the template");
  return *out[0];
}

// Byte for byte what jinja2 renders from a template, for each conversation
// it accepts; returns how many matched.
int expect_same_as_jinja(ChatFamily f, const std::string& jinja, const std::string& what) {
  const auto want = jinja_render(jinja);
  int same = 0;
  for (size_t i = 0; i < kConversations.size(); ++i) {
    if (!want[i]) continue;  // the template refuses it (Gemma 2: no system role)
    const std::string got = render_chat(f, kConversations[i], kBos, kEos, kToday);
    EXPECT_EQ(got, *want[i]) << what << ", conversation " << i;
    same += got == *want[i];
  }
  return same;
}

// The templates models made here carry render as the engine formats.
TEST(ChatTemplate, OurTemplatesRenderInJinja2AsTheEngineFormats) {
  REQUIRE_JINJA2();
  for (const std::string& name : chat_family_names()) {
    const ChatFamily f = *chat_family_from_name(name);
    expect_same_as_jinja(f, chat_template_jinja(f), name);
  }
}

// The real templates of the small models users run, from the leading C++
// engine's source, rendered by jinja2: the family that stands for each
// (serve --chat-template NAME) formats byte for byte the same.
TEST(ChatTemplate, RealTemplatesOfTheSmallModelsRenderAsJinja2Does) {
  REQUIRE_JINJA2();
  DEPCACHE_REQUIRE_LLAMA_CPP(dir, "models/templates");
  const std::pair<const char*, ChatFamily> cases[] = {
      {"meta-llama-Llama-3.1-8B-Instruct", ChatFamily::Llama31},
      {"meta-llama-Llama-3.2-3B-Instruct", ChatFamily::Llama31},
      {"meta-llama-Llama-3.3-70B-Instruct", ChatFamily::Llama31},
      {"Qwen-Qwen2.5-7B-Instruct", ChatFamily::Qwen25},
      {"Qwen-Qwen3-0.6B", ChatFamily::Qwen3},
      {"Qwen3.5-4B", ChatFamily::Qwen35},
      {"google-gemma-2-2b-it", ChatFamily::Gemma},
      {"microsoft-Phi-3.5-mini-instruct", ChatFamily::Phi3},
      {"mistralai-Mistral-Nemo-Instruct-2407", ChatFamily::MistralNemo},
  };
  for (const auto& [file, family] : cases) {
    SCOPED_TRACE(file);
    std::ifstream is(dir / (std::string(file) + ".jinja"));
    const std::string jinja((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(jinja.empty());
    const int same = expect_same_as_jinja(family, jinja, file);
    std::printf("[check] %s: %s, %d conversations identical\n", file,
                std::string(chat_family_name(family)).c_str(), same);
  }
}

TEST(ChatTemplate, BadConversationsAreRejected) {
  EXPECT_THROW(render_chat(ChatFamily::ChatML, {}), Error);
  const std::vector<ChatMessage> bad_role = {{"tool", "x"}, {"user", "y"}};
  EXPECT_THROW(render_chat(ChatFamily::ChatML, bad_role), Error);
  const std::vector<ChatMessage> ends_with_system = {{"user", "x"}, {"system", "y"}};
  EXPECT_THROW(render_chat(ChatFamily::Llama3, ends_with_system), Error);
}

TEST(ChatTemplate, AModelWrittenWithATemplateCarriesIt) {
  RandomModelOptions o;
  o.shape = *model_preset("tiny");
  o.shape.n_layer = 1;
  o.chat_template = chat_template_jinja(ChatFamily::Zephyr);
  const auto path = test::temp_path("chat_template.gguf");
  write_random_model(path, o);
  const Vocab v = Vocab::from_gguf(GgufFile::open(path));
  EXPECT_EQ(v.chat_template, o.chat_template);
  EXPECT_EQ(ChatFormat::from_jinja(v.chat_template).render(kTwoTurns, "<s>", "</s>").text,
            render_chat(ChatFamily::Zephyr, kTwoTurns));
  std::filesystem::remove(path);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache
