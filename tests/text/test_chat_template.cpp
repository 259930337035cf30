// Chat templates: the exact prompt text per family (expected strings written out from what each
// official Jinja template produces), detection from template sources, overrides by name, errors,
// and every tokenizer.chat_template found in the reference folder.
#include <gtest/gtest.h>

#include <filesystem>

#include "moesh/gguf/gguf.h"
#include "moesh/text/chat.h"

namespace moesh {
namespace {

using Msgs = std::vector<ChatMessage>;

const Msgs kSysUser = {{"system", "You are terse."}, {"user", "Hi there"}};
const Msgs kMulti = {{"system", "Be kind."}, {"user", "What is 2+2?"}, {"assistant", "4"}, {"user", "And 3+3?"}};
const Msgs kUserOnly = {{"user", "Hello"}};
const Msgs kEndsAssistant = {{"user", "Ping"}, {"assistant", "Pong"}};

std::string render(const ChatTemplate& t, const Msgs& m, bool gen = true) {
  auto r = t.render(m, gen);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : std::string();
}

TEST(ChatTemplate, ChatML) {
  ChatTemplate t(ChatFormat::kChatML);
  EXPECT_EQ(render(t, kSysUser),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render(t, kMulti, false),
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n");
  EXPECT_EQ(render(t, kUserOnly), "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_FALSE(t.renders_bos());
  EXPECT_EQ(t.stop_strings(), std::vector<std::string>{"<|im_end|>"});
}

TEST(ChatTemplate, ChatMLDefaultSystemFromQwen25Source) {
  // The shape of the Qwen2.5 template: a literal default system turn when the caller has none.
  const std::string src =
      "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] "
      "+ '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba "
      "Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages "
      "%}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
      "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
  auto t = ChatTemplate::from_spec(src);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->format(), ChatFormat::kChatML);
  EXPECT_EQ(t->options().default_system, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_EQ(render(*t, kUserOnly),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
  // A caller's system message replaces the default.
  EXPECT_EQ(render(*t, kSysUser),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\n");
  // Qwen3-style source: the system turn is an expression, so there is no default.
  auto q3 = ChatTemplate::from_spec(
      "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
      "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}");
  ASSERT_TRUE(q3.is_ok());
  EXPECT_EQ(q3->options().default_system, "");
}

TEST(ChatTemplate, Deepseek3) {
  ChatTemplate t(ChatFormat::kDeepseek3);
  EXPECT_EQ(render(t, kSysUser), "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi there<｜Assistant｜>");
  EXPECT_EQ(render(t, kMulti, false),
            "<｜begin▁of▁sentence｜>Be kind.<｜User｜>What is 2+2?<｜Assistant｜>4"
            "<｜end▁of▁sentence｜><｜User｜>And 3+3?");
  // Several system messages are joined, wherever they are; old reasoning is dropped.
  const Msgs m = {
      {"system", "A"}, {"user", "q"}, {"assistant", "<think>x</think>ans"}, {"system", "B"}, {"user", "q2"}};
  EXPECT_EQ(render(t, m),
            "<｜begin▁of▁sentence｜>A\n\nB<｜User｜>q<｜Assistant｜>ans<｜end▁of▁sentence｜>"
            "<｜User｜>q2<｜Assistant｜>");
  EXPECT_TRUE(t.renders_bos());
}

TEST(ChatTemplate, Deepseek3VariantsFromSource) {
  // R1: "<think>\n" after the generation prompt; the distill template keeps the last system only.
  const std::string r1_distill =
      "{%- set ns = namespace(is_first=false, is_tool=false, system_prompt='') -%}"
      "{%- if message['role'] == 'system' -%}{%- set ns.system_prompt = message['content'] -%}"
      "{{'<｜User｜>' + message['content']}}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}"
      "{%- if add_generation_prompt and not ns.is_tool -%}{{'<｜Assistant｜><think>\\n'}}";
  auto t = ChatTemplate::from_spec(r1_distill);
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->format(), ChatFormat::kDeepseek3);
  EXPECT_FALSE(t->options().deepseek_join_systems);
  const Msgs m = {{"system", "A"}, {"system", "B"}, {"user", "q"}};
  EXPECT_EQ(render(*t, m), "<｜begin▁of▁sentence｜>B<｜User｜>q<｜Assistant｜><think>\n");
  // V3.1: the assistant header carries "</think>" and follows only a user turn.
  const std::string v31 =
      "{%- set ns = namespace(is_first=false, is_tool=false, system_prompt='', is_first_sp=true, "
      "is_last_user=false) -%}{{'<｜User｜>' + message['content']}}{{'<｜Assistant｜>'}}"
      "{{'</think>'}}{{content + '<｜end▁of▁sentence｜>'}}";
  auto t31 = ChatTemplate::from_spec(v31);
  ASSERT_TRUE(t31.is_ok());
  EXPECT_TRUE(t31->options().deepseek_v31);
  EXPECT_EQ(render(*t31, kMulti),
            "<｜begin▁of▁sentence｜>Be kind.<｜User｜>What is 2+2?<｜Assistant｜></think>4"
            "<｜end▁of▁sentence｜><｜User｜>And 3+3?<｜Assistant｜></think>");
  EXPECT_EQ(render(*t31, kEndsAssistant),
            "<｜begin▁of▁sentence｜><｜User｜>Ping<｜Assistant｜></think>Pong<｜end▁of▁sentence｜>");
}

TEST(ChatTemplate, Deepseek2) {
  ChatTemplate t(ChatFormat::kDeepseek2);
  EXPECT_EQ(render(t, kSysUser), "<｜begin▁of▁sentence｜>You are terse.\n\nUser: Hi there\n\nAssistant:");
  EXPECT_EQ(render(t, kMulti, false),
            "<｜begin▁of▁sentence｜>Be kind.\n\nUser: What is 2+2?\n\nAssistant: 4<｜end▁of▁sentence｜>"
            "User: And 3+3?\n\n");
  EXPECT_TRUE(t.renders_bos());
}

TEST(ChatTemplate, Llama3) {
  ChatTemplate t(ChatFormat::kLlama3);
  EXPECT_EQ(render(t, kSysUser),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Content is trimmed (Jinja `trim`, Unicode whitespace included: U+00A0 and U+3000 here).
  const Msgs m = {{"user", " \n\xc2\xa0spaced\tout \xe3\x80\x80\n"}, {"assistant", "ok "}};
  EXPECT_EQ(render(t, m, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nspaced\tout<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|>");
  EXPECT_TRUE(t.renders_bos());
  EXPECT_EQ(t.stop_strings(), std::vector<std::string>{"<|eot_id|>"});
}

// Llama 4 (llama4 models): the Llama 3 layout with its own header and end-of-turn tokens.
TEST(ChatTemplate, Llama4) {
  ChatTemplate t(ChatFormat::kLlama4);
  EXPECT_EQ(render(t, kSysUser),
            "<|begin_of_text|><|header_start|>system<|header_end|>\n\nYou are terse.<|eot|>"
            "<|header_start|>user<|header_end|>\n\nHi there<|eot|>"
            "<|header_start|>assistant<|header_end|>\n\n");
  EXPECT_EQ(render(t, {{"user", " x "}, {"assistant", "y\n"}}, false),
            "<|begin_of_text|><|header_start|>user<|header_end|>\n\nx<|eot|>"
            "<|header_start|>assistant<|header_end|>\n\ny<|eot|>");
  EXPECT_TRUE(t.renders_bos());
  EXPECT_EQ(t.stop_strings(), (std::vector<std::string>{"<|eot|>", "<|eom|>"}));
}

// GLM-4.5/4.6 (glm4moe models) and the older GLM-4 layout.
TEST(ChatTemplate, Glm4) {
  ChatTemplate t(ChatFormat::kGlm4);
  EXPECT_EQ(render(t, kSysUser), "[gMASK]<sop><|system|>\nYou are terse.<|user|>\nHi there<|assistant|>");
  EXPECT_EQ(render(t, kMulti),
            "[gMASK]<sop><|system|>\nBe kind.<|user|>\nWhat is 2+2?<|assistant|>\n<think></think>\n4"
            "<|user|>\nAnd 3+3?<|assistant|>");
  EXPECT_FALSE(t.renders_bos());
  EXPECT_EQ(t.stop_strings(), (std::vector<std::string>{"<|user|>", "<|observation|>", "<|endoftext|>"}));
  ChatTemplateOptions old;
  old.glm45 = false;
  ChatTemplate t4(ChatFormat::kGlm4, old);
  EXPECT_EQ(render(t4, kMulti),
            "[gMASK]<sop><|system|>\nBe kind.<|user|>\nWhat is 2+2?<|assistant|>\n4<|user|>\nAnd 3+3?<|assistant|>\n");
  // Detection picks the layout from the template source.
  auto t45 = ChatTemplate::from_spec("[gMASK]<sop>{% for m in messages %}{{ '\n<think></think>' }}{% endfor %}");
  ASSERT_TRUE(t45.is_ok());
  EXPECT_EQ(t45->format(), ChatFormat::kGlm4);
  EXPECT_EQ(render(*t45, kEndsAssistant, false), "[gMASK]<sop><|user|>\nPing<|assistant|>\n<think></think>\nPong");
  auto tg4 = ChatTemplate::from_spec("[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>{% endfor %}");
  ASSERT_TRUE(tg4.is_ok());
  EXPECT_EQ(render(*tg4, kEndsAssistant, false), "[gMASK]<sop><|user|>\nPing<|assistant|>\nPong");
  EXPECT_EQ(chat_format_from_name("glm-4.5").value(), ChatFormat::kGlm4);
  EXPECT_EQ(chat_format_from_name("llama4").value(), ChatFormat::kLlama4);
}

TEST(ChatTemplate, Harmony) {
  ChatTemplateOptions o;
  o.harmony_date = "2025-06-28";
  ChatTemplate t(ChatFormat::kHarmony, o);
  const std::string sys =
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
      "Knowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: medium\n\n"
      "# Valid channels: analysis, commentary, final. Channel must be included for every "
      "message.<|end|>";
  EXPECT_EQ(render(t, kSysUser), sys +
                                     "<|start|>developer<|message|># Instructions\n\nYou are terse.\n\n<|end|>"
                                     "<|start|>user<|message|>Hi there<|end|><|start|>assistant");
  EXPECT_EQ(render(t, kMulti), sys +
                                   "<|start|>developer<|message|># Instructions\n\nBe kind.\n\n<|end|>"
                                   "<|start|>user<|message|>What is 2+2?<|end|>"
                                   "<|start|>assistant<|channel|>final<|message|>4<|end|>"
                                   "<|start|>user<|message|>And 3+3?<|end|><|start|>assistant");
  // The final assistant turn ends in <|return|> when no generation prompt follows.
  EXPECT_EQ(render(t, kEndsAssistant, false), sys +
                                                  "<|start|>user<|message|>Ping<|end|>"
                                                  "<|start|>assistant<|channel|>final<|message|>Pong<|return|>");
  EXPECT_EQ(render(t, kEndsAssistant, true),
            sys +
                "<|start|>user<|message|>Ping<|end|>"
                "<|start|>assistant<|channel|>final<|message|>Pong<|end|><|start|>assistant");
  // "developer" is a role of its own here; an empty one is not rendered.
  EXPECT_EQ(render(t, {{"developer", ""}, {"user", "x"}}), sys + "<|start|>user<|message|>x<|end|><|start|>assistant");
  EXPECT_FALSE(t.renders_bos());
  EXPECT_EQ(t.stop_strings(), (std::vector<std::string>{"<|return|>", "<|call|>"}));
  // Without a fixed date the line carries today's date: YYYY-MM-DD.
  auto today = ChatTemplate(ChatFormat::kHarmony).render(kUserOnly);
  ASSERT_TRUE(today.is_ok());
  const size_t p = today->find("Current date: ");
  ASSERT_NE(p, std::string::npos);
  const std::string date = today->substr(p + 14, 10);
  EXPECT_EQ(date.size(), 10u);
  EXPECT_EQ(date[4], '-');
  EXPECT_EQ(date[7], '-');
  EXPECT_EQ(today->substr(p + 24, 2), "\n\n");
}

TEST(ChatTemplate, HarmonyRejects) {
  ChatTemplate t(ChatFormat::kHarmony);
  auto r = t.render({{"user", "a"}, {"system", "late"}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  r = t.render({{"user", "a"}, {"assistant", "<|channel|>final<|message|>x"}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("<|channel|>"), std::string::npos);
}

TEST(ChatTemplate, Mistral) {
  ChatTemplate t(ChatFormat::kMistral);
  EXPECT_EQ(render(t, kSysUser), "<s> [INST] You are terse.\n\nHi there [/INST]");
  EXPECT_EQ(render(t, kMulti, false), "<s> [INST] Be kind.\n\nWhat is 2+2? [/INST] 4</s> [INST] And 3+3? [/INST]");
  // add_generation_prompt changes nothing: [/INST] already hands over the turn.
  EXPECT_EQ(render(t, kUserOnly, true), render(t, kUserOnly, false));
  EXPECT_EQ(render(t, kEndsAssistant), "<s> [INST] Ping [/INST] Pong</s>");
  EXPECT_TRUE(t.renders_bos());
  // Alternation is enforced.
  auto r = t.render({{"user", "a"}, {"user", "b"}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("alternate"), std::string::npos);
  EXPECT_FALSE(t.render({{"assistant", "a"}}).is_ok());
  EXPECT_FALSE(t.render({{"system", "s"}, {"user", "a"}, {"system", "b"}}).is_ok());
}

TEST(ChatTemplate, MistralLegacyFromSource) {
  // The original Mixtral-8x7B-Instruct-v0.1 shape: no spaces around [INST], no system role.
  const std::string src =
      "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
      "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate') }}"
      "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
      "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% endif %}"
      "{% endfor %}";
  auto t = ChatTemplate::from_spec(src);
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->format(), ChatFormat::kMistral);
  EXPECT_TRUE(t->options().mistral_legacy);
  EXPECT_EQ(render(*t, Msgs(kMulti.begin() + 1, kMulti.end())),
            "<s>[INST] What is 2+2? [/INST]4</s>[INST] And 3+3? [/INST]");
  EXPECT_FALSE(t->render(kSysUser).is_ok());
}

TEST(ChatTemplate, DetectFromSources) {
  struct Case {
    const char* src;
    ChatFormat want;
  };
  const Case cases[] = {
      {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
       "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}",
       ChatFormat::kChatML},
      {"{{ bos_token }}{{ ns.system_prompt }}{{'<｜User｜>' + message['content']}}"
       "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}",
       ChatFormat::kDeepseek3},
      {"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
       "{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}"
       "{{ 'Assistant: ' + message['content'] + eos_token }}{% endif %}{% endfor %}"
       "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}",
       ChatFormat::kDeepseek2},
      {"{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
       "message['content'] | trim + '<|eot_id|>' %}",
       ChatFormat::kLlama3},
      {"{{- \"<|start|>system<|message|>\" }}{{- \"<|start|>assistant<|channel|>final<|message|>\" "
       "+ message.content + \"<|end|>\" }}",
       ChatFormat::kHarmony},
      {"{{- ' [INST] ' + message['content'] + ' [/INST]' }}", ChatFormat::kMistral},
      {"{{- bos_token }}{{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' }}", ChatFormat::kLlama4},
      {"[gMASK]<sop>{%- for m in messages %}{%- if m.role == 'user' -%}<|user|>", ChatFormat::kGlm4},
  };
  for (const auto& c : cases) {
    auto f = detect_chat_format(c.src);
    ASSERT_TRUE(f.is_ok()) << c.src;
    EXPECT_EQ(*f, c.want) << c.src;
  }
  auto none = detect_chat_format("{% for m in messages %}{{ m.content }}{% endfor %}");
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
}

TEST(ChatTemplate, Names) {
  for (int i = 0; i < static_cast<int>(ChatFormat::kCOUNT); ++i) {
    const auto f = static_cast<ChatFormat>(i);
    auto back = chat_format_from_name(chat_format_name(f));
    ASSERT_TRUE(back.is_ok()) << chat_format_name(f);
    EXPECT_EQ(*back, f);
  }
  EXPECT_EQ(*chat_format_from_name("qwen"), ChatFormat::kChatML);
  EXPECT_EQ(*chat_format_from_name("mixtral"), ChatFormat::kMistral);
  auto bad = chat_format_from_name("vicuna");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("chatml"), std::string::npos);  // lists the known names
  EXPECT_FALSE(ChatTemplate::from_spec("vicuna").is_ok());
}

TEST(ChatTemplate, Errors) {
  for (int i = 0; i < static_cast<int>(ChatFormat::kCOUNT); ++i) {
    ChatTemplate t(static_cast<ChatFormat>(i));
    auto empty = t.render({});
    ASSERT_FALSE(empty.is_ok()) << chat_format_name(t.format());
    EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
    auto role = t.render({{"user", "a"}, {"robot", "b"}});
    ASSERT_FALSE(role.is_ok());
    EXPECT_NE(role.status().message().find("'robot'"), std::string::npos);
  }
  // "developer" exists only in harmony.
  EXPECT_FALSE(ChatTemplate(ChatFormat::kChatML).render({{"developer", "x"}}).is_ok());
}

Result<std::unique_ptr<gguf::File>> gguf_with(const std::string& key, const std::string& value) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("test"));
  if (!key.empty()) w.set(key, gguf::Value::str(value));
  auto bytes = w.write_bytes();
  if (!bytes) return bytes.status();
  return gguf::File::from_bytes(std::move(*bytes));
}

TEST(ChatTemplate, FromGgufAndOverride) {
  auto f = gguf_with("tokenizer.chat_template",
                     "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + "
                     "message['role'] + '<|end_header_id|>\\n\\n' }}{% endfor %}");
  ASSERT_TRUE(f.is_ok());
  auto t = ChatTemplate::from_gguf(**f);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->format(), ChatFormat::kLlama3);
  // Override by name and by Jinja source.
  auto byname = ChatTemplate::from_gguf(**f, "chatml");
  ASSERT_TRUE(byname.is_ok());
  EXPECT_EQ(byname->format(), ChatFormat::kChatML);
  auto bysrc = ChatTemplate::from_gguf(**f, "{{ '[INST] ' + message['content'] + ' [/INST]' }}");
  ASSERT_TRUE(bysrc.is_ok());
  EXPECT_EQ(bysrc->format(), ChatFormat::kMistral);
  EXPECT_FALSE(ChatTemplate::from_gguf(**f, "nonsense").is_ok());
  // No template and no override.
  auto bare = gguf_with("", "");
  ASSERT_TRUE(bare.is_ok());
  auto none = ChatTemplate::from_gguf(**bare);
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("--chat-template"), std::string::npos);
  EXPECT_TRUE(ChatTemplate::from_gguf(**bare, "harmony").is_ok());
}

// Every tokenizer.chat_template (and named tokenizer.chat_template.<name>) in the reference GGUFs
// must be recognised.
TEST(ChatTemplate, ReferenceTemplatesDetected) {
  namespace fs = std::filesystem;
  const fs::path dir = MOESH_REFERENCE_DIR;
  if (!fs::is_directory(dir)) {
    GTEST_SKIP() << "SKIP: reference folder " << dir << " not found (set MOESH_REFERENCE_DIR)";
  }
  int files = 0, templates = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().extension() != ".gguf") continue;
    auto f = gguf::File::open(e.path().string());
    ASSERT_TRUE(f.is_ok()) << e.path() << ": " << f.status().to_string();
    ++files;
    for (const auto& [key, value] : (*f)->kvs()) {
      if (key.rfind("tokenizer.chat_template", 0) != 0) continue;
      auto src = (*f)->get<std::string>(key);
      ASSERT_TRUE(src.is_ok()) << e.path() << " " << key;
      ++templates;
      auto fmt = detect_chat_format(*src);
      EXPECT_TRUE(fmt.is_ok()) << e.path() << " " << key << " not recognised";
      if (fmt.is_ok()) {
        const auto opts = detect_chat_options(*fmt, *src);
        auto out = ChatTemplate(*fmt, opts).render(kSysUser);
        if (*fmt == ChatFormat::kMistral && opts.mistral_legacy) {
          // Mixtral v0.1's template has no system role: refused, saying so.
          ASSERT_FALSE(out.is_ok()) << e.path();
          EXPECT_NE(out.status().message().find("not system"), std::string::npos) << e.path();
        } else {
          EXPECT_TRUE(out.is_ok()) << e.path() << ": " << out.status().to_string();
        }
      }
    }
  }
  EXPECT_GT(files, 0) << "no .gguf files under " << dir;
  std::printf("[chat] %d reference GGUFs scanned, %d chat templates found and checked\n", files, templates);
  // Nothing to recognise is not a pass: say so to ctest (the current reference set has no
  // tokenizer.chat_template key in any file; DetectFromSources covers the known sources).
  if (templates == 0) GTEST_SKIP() << "no chat template in the " << files << " reference GGUFs: nothing checked";
}

}  // namespace
}  // namespace moesh
