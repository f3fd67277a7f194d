#include "prompt/jinja_oracle.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "test_support.h"

namespace depcache::test {

std::vector<std::optional<Jinja2Renders>> jinja2_render(const std::vector<std::string>& templates,
                                                        const Jinja2Job& job) {
  // Ordered: a message's keys reach jinja2 as a client sends them (role, content).
  nlohmann::ordered_json in = {{"templates", templates},
                               {"bos_token", job.bos},
                               {"eos_token", job.eos},
                               {"date_string", job.today},
                               {"conversations", nlohmann::json::array()}};
  for (const auto& conv : job.conversations) {
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    for (const ChatMessage& m : conv) msgs.push_back({{"role", m.role}, {"content", m.content}});
    in["conversations"].push_back(msgs);
  }
  const auto path = temp_path("jinja-job");
  std::ofstream(path) << in.dump();
  const auto run = run_shell(fmt::format("/usr/bin/python3 {}/../prompt/render_jinja.py < {} 2>&1",
                                         DEPCACHE_CLIENT_DIR, path.string()));
  std::filesystem::remove(path);
  if (run.code != 0) throw std::runtime_error("render_jinja.py failed: " + run.out);
  std::vector<std::optional<Jinja2Renders>> out;
  for (const auto& per_template : nlohmann::json::parse(run.out)) {
    if (per_template.is_object()) {
      out.push_back(std::nullopt);
      continue;
    }
    Jinja2Renders renders;
    for (const auto& r : per_template) {
      if (!r.is_string()) {
        renders.push_back(std::nullopt);
        continue;
      }
      std::string text = r.get<std::string>();
      if (text.starts_with(job.bos)) text.erase(0, job.bos.size());
      renders.push_back(std::move(text));
    }
    out.push_back(std::move(renders));
  }
  return out;
}

const std::vector<std::vector<ChatMessage>>& chat_conversations() {
  static const std::vector<std::vector<ChatMessage>> conversations = {
      {{"user", "Hi there"}},
      {{"system", "Be brief."}, {"user", "What is 2+2?"}},
      {{"system", "Be brief."}, {"user", "What is 2+2?"}, {"assistant", "Four."}, {"user", "And 3+3?"}},
      {{"user", "Hi"}, {"assistant", " Hello! \n"}, {"user", "  spaced out \n"}},
      {{"user", "2+2?"}, {"assistant", "<think>\nAdd them.\n</think>\n\nFour."}, {"user", "Sure?"}},
  };
  return conversations;
}

bool jinja2_available() { return run_shell("/usr/bin/python3 -c 'import jinja2' 2>&1").code == 0; }

}  // namespace depcache::test
