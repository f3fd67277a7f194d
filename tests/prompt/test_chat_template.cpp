#include <gtest/gtest.h>

#include <vector>

#include "model/gguf.h"
#include "model/model_writer.h"
#include "model/vocab.h"
#include "prompt/chat_template.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace {

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

TEST(ChatTemplate, FamiliesAreRecognisedFromTheirMarkers) {
  for (const std::string& name : chat_family_names()) {
    const ChatFamily f = *chat_family_from_name(name);
    EXPECT_EQ(chat_family_name(f), name);
    EXPECT_EQ(detect_chat_family(chat_template_jinja(f)), f) << name;
  }
  EXPECT_FALSE(chat_family_from_name("alpaca"));
  EXPECT_FALSE(
      detect_chat_family("{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}{% endfor %}"));
  EXPECT_FALSE(detect_chat_family(""));
}

TEST(ChatTemplate, BadConversationsAreRejected) {
  EXPECT_THROW(render_chat(ChatFamily::ChatML, {}), Error);
  const std::vector<ChatMessage> bad_role = {{"tool", "x"}, {"user", "y"}};
  EXPECT_THROW(render_chat(ChatFamily::ChatML, bad_role), Error);
  const std::vector<ChatMessage> ends_with_assistant = {{"user", "x"}, {"assistant", "y"}};
  EXPECT_THROW(render_chat(ChatFamily::Llama3, ends_with_assistant), Error);
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
  EXPECT_EQ(detect_chat_family(v.chat_template), ChatFamily::Zephyr);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace depcache
