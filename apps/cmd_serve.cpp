// `depcache serve`: the engine behind an OpenAI-compatible HTTP API; and
// `depcache route`: the router that sends requests to the serve replica
// holding their KV, for a proxy in front of several.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <hiredis/hiredis.h>
#include <httplib.h>
#include <pthread.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cli_common.h"
#include "commands.h"
#include "engine/engine_loop.h"
#include "engine_options.h"
#include "kv/kv_events.h"
#include "kv/redis_connection.h"
#include "model/model.h"
#include "model/vocab.h"
#include "prompt/chat_template.h"
#include "retrieval/corpus.h"
#include "retrieval/knowledge_graph.h"
#include "retrieval/retriever.h"
#include "server/http_server.h"
#include "server/kv_event_publisher.h"
#include "server/openai.h"
#include "server/replica_router.h"
#include "strategy/strategy.h"
#include "strategy/subgcache.h"
#include "tier_options.h"
#include "util/error.h"
#include "util/file_io.h"
#include "util/hash.h"

namespace depcache::cli {
namespace {

// The chat format: the family asked for, else the model's own template. A
// template the interpreter cannot read stops the server, naming what it
// cannot read, rather than chats being formatted by a guess.
std::optional<ChatFormat> served_chat_format(const std::string& asked, const std::string& model_template) {
  if (!asked.empty()) return ChatFormat(*chat_family_from_name(asked));
  if (model_template.empty()) {
    fmt::print(stderr,
               "depcache serve: the model has no chat template: /v1/chat/completions answers 400 unless "
               "--chat-template is given\n");
    return std::nullopt;
  }
  try {
    return ChatFormat::from_jinja(model_template);
  } catch (const Error& e) {
    fail(ErrorKind::InvalidInput,
         "the model's chat template cannot be run here ({}); name a format with --chat-template ({}) if one "
         "fits",
         e.what(), fmt::join(chat_family_names(), ", "));
  }
}

// The deployment's secret (--cache-key-file), which seals records and KV
// events; null without one.
std::shared_ptr<const MacKey> deployment_key(const TierOptions& t) {
  if (t.cache_key_file.empty()) return nullptr;
  return std::make_shared<const MacKey>(MacKey::from_file(t.cache_key_file));
}

// serve's command line.
struct ServeArgs {
  std::string model_path;
  ServerOptions so;
  EngineArgs engine_args;
  double drain_s = 30;
  int64_t pool_rows = 16384;
  std::string chat_template, kg_path, corpus_path, corpus_format = "auto";
  std::string api_key, api_key_file, operator_key_file;
  int64_t request_timeout_ms = so.http.request_timeout.count(),
          keep_alive_ms = so.http.keep_alive_timeout.count(),
          write_timeout_ms = so.http.write_timeout.count();
  double stage_latency_ms = 0;
  int64_t batch_window_ms = 50;
  bool kv_events = false;
  std::string kv_events_redis;  // where to publish, when not the remote tier's Redis
  std::string replica_name;
  int64_t kv_events_block = 16;
};

// The server's options from the command line's: timeouts, keys (from a
// file, the environment or the command line: one source), batching.
void finish_options(ServeArgs& a) {
  a.so.search.stage_latency = std::chrono::microseconds(std::llround(a.stage_latency_ms * 1000));
  a.so.http.request_timeout = std::chrono::milliseconds(a.request_timeout_ms);
  a.so.http.keep_alive_timeout = std::chrono::milliseconds(a.keep_alive_ms);
  a.so.http.write_timeout = std::chrono::milliseconds(a.write_timeout_ms);
  // Keys: from a file, the environment or the command line (one source).
  const char* env_key = std::getenv("DEPCACHE_API_KEY");
  const int sources = !a.api_key_file.empty() + !a.api_key.empty() + (env_key && *env_key);
  if (sources > 1)
    throw CLI::ValidationError("--api-key-file",
                               "give keys in one way: --api-key-file, --api-key or DEPCACHE_API_KEY");
  if (!a.api_key_file.empty()) a.so.api_keys = read_api_key_file(a.api_key_file);
  if (!a.api_key.empty()) a.so.api_keys = {ApiKey{a.api_key, {}}};
  if (env_key && *env_key) a.so.api_keys = {ApiKey{env_key, {}}};
  if (sources == 1 && a.api_key_file.empty() && a.so.api_keys[0].key.size() < ApiKey::kMinChars)
    throw CLI::ValidationError(
        a.api_key.empty() ? "DEPCACHE_API_KEY" : "--api-key",
        fmt::format("a key shorter than {} characters is too easy to guess", ApiKey::kMinChars));
  if (!a.operator_key_file.empty()) a.so.operator_key = read_operator_key_file(a.operator_key_file);
  for (const ApiKey& k : a.so.api_keys)
    if (!a.so.operator_key.empty() && k.key == a.so.operator_key)
      throw CLI::ValidationError("--operator-key-file", "the operator key must not also be a tenant's key");
  a.so.subgcache.window = std::chrono::milliseconds(a.batch_window_ms);
  if (a.so.search.speculate && a.so.search.stages < 2)
    throw CLI::ValidationError("--speculate", "needs --search-stages 2 or more");
}

// The retrieval sources the server answers rag.retrieve from.
struct Sources {
  std::unique_ptr<KnowledgeGraph> kg;
  std::unique_ptr<GraphRetriever> graph;
  std::unique_ptr<ChunkIndex> corpus;
};
Sources load_sources(const ServeArgs& a, const Tokenizer& tok, ServedModel& served) {
  Sources out;
  if (!a.kg_path.empty()) {
    out.kg = std::make_unique<KnowledgeGraph>(KnowledgeGraph::load(a.kg_path));
    out.graph = std::make_unique<GraphRetriever>(*out.kg);
    served.graph = out.graph.get();
    fmt::print(stderr, "depcache serve: knowledge graph {} ({} entities, {} triples)\n", a.kg_path,
               out.kg->n_entities(), out.kg->n_triples());
  }
  if (!a.corpus_path.empty()) {
    out.corpus = std::make_unique<ChunkIndex>(
        ChunkIndex::build(load_corpus(a.corpus_path, parse_corpus_format(a.corpus_format)), tok));
    served.corpus = out.corpus.get();
    fmt::print(stderr, "depcache serve: corpus {} ({} documents, {} chunks)\n", a.corpus_path,
               out.corpus->corpus().docs.size(), out.corpus->chunks().size());
  }
  return out;
}

// SIGTERM and SIGINT, blocked on this thread and every thread it starts from
// now on, for the caller's sigwait.
sigset_t block_stop_signals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

// The replica's name and epoch in the server's options, and with
// --kv-events the log its KV events are published from (null without). The
// name is known once the port is: set before the server copies its options,
// so it is read back from them.
std::shared_ptr<KvEventLog> name_replica(ServeArgs& a) {
  a.so.epoch = new_epoch();
  if (a.so.port == 0 && a.kv_events && a.replica_name.empty())
    fail(ErrorKind::InvalidInput, "--kv-events with --port 0 needs --replica-name");
  a.so.replica = a.replica_name.empty() ? fmt::format("{}:{}", a.so.host, a.so.port) : a.replica_name;
  if (!a.kv_events) return nullptr;
  if (!a.engine_args.tiers.remote() && a.kv_events_redis.empty())
    fail(ErrorKind::InvalidInput,
         "--kv-events publishes on the remote tier's Redis (--redis or --redis-cluster) or on "
         "--kv-events-redis: give one");
  auto kv_log = std::make_shared<KvEventLog>(a.kv_events_block, deployment_key(a.engine_args.tiers));
  a.so.kv_events = kv_log;
  return kv_log;
}

// Publishes the KV events of `kv_log`, with the loop's load, on the Redis
// channel the router reads.
std::unique_ptr<KvEventPublisher> start_publisher(const ServeArgs& a, const TierOptions& tiers,
                                                  const std::shared_ptr<KvEventLog>& kv_log,
                                                  EngineLoop& loop) {
  KvEventPublisherOptions po;
  po.redis = redis_options(tiers);
  po.nodes = parse_redis_addresses(!a.kv_events_redis.empty()    ? a.kv_events_redis
                                   : tiers.redis_cluster.empty() ? tiers.redis
                                                                 : tiers.redis_cluster);
  po.channel = po.redis.prefix + "kv-events";
  po.header = {a.so.replica, a.so.epoch, a.kv_events_block};
  po.key = deployment_key(a.engine_args.tiers);
  auto publisher = std::make_unique<KvEventPublisher>(kv_log, po, [&loop] {
    const EngineSnapshot s = loop.snapshot();
    return ReplicaLoad{static_cast<int64_t>(s.running), static_cast<int64_t>(s.waiting),
                       s.finished + s.cancelled + s.failed};
  });
  fmt::print(stderr, "depcache serve: KV events of replica '{}' (epoch {}) on channel {}, {}\n", a.so.replica,
             a.so.epoch, po.channel, po.key ? "sealed with the cache key" : "unsealed (no --cache-key-file)");
  return publisher;
}

// Listens, loads the model and its sources, serves until SIGTERM or SIGINT,
// then drains.
void serve(ServeArgs& a) {
  const sigset_t stop_signals = block_stop_signals();

  finish_options(a);
  const std::shared_ptr<KvEventLog> kv_log = name_replica(a);
  HttpServer http(a.so);
  const int port = http.listen();
  fmt::print(stderr, "depcache serve: listening on http://{}:{} (loading {})\n", a.so.host, port,
             a.model_path);
  std::fflush(stderr);
  std::shared_ptr<const Model> model = Model::load(a.model_path, {a.pool_rows});
  auto tok = std::make_shared<const Tokenizer>(Vocab::from_gguf(model->file()));
  ServedModel served;
  served.name = std::filesystem::path(a.model_path).stem().string();
  served.tokenizer = tok;
  served.n_ctx = std::min<int64_t>(a.pool_rows, model->config().n_ctx_train);
  served.chat = served_chat_format(a.chat_template, tok->vocab().chat_template);
  served.prompt = model->config().prompt;
  // Read before the engine starts, so a bad file stops the server at once.
  const Sources sources = load_sources(a, *tok, served);
  // Every strategy is served by one engine: the default strategy's profile
  // (its policy, scheduler, tiers) is the engine's.
  const ResolvedEngine re = resolve_engine(a.engine_args, a.so.strategy, model->config(), a.pool_rows, true);
  EngineOptions eo = re.engine;
  eo.tokenizer = tok;
  eo.eog_ids = tok->eog_ids();
  const TierOptions& tiers = re.tiers;
  fmt::print(stderr, "depcache serve: default strategy {}: {}; positions {}\n", a.so.strategy, re.summary,
             position_scheme_name(eo.strategy.scheme));
  if (const std::string mode = apply_matmul_mode(a.engine_args); !mode.empty())
    fmt::print(stderr, "depcache serve: {}\n", mode);
  std::unique_ptr<EngineTiers> lower;
  EngineLoop loop(
      model, eo,
      [&](Engine& e) {
        if (kv_log) e.observe_cache(kv_log);  // before the tiers: what the disk holds is news too
        lower = std::make_unique<EngineTiers>(e, tiers, "depcache serve: ");
        profile_costs_if_needed(e, re, "depcache serve: ");
      },
      [&](Engine&) {
        if (!lower) return;
        try {
          lower->persist();  // the next server starts from what this one computed
        } catch (const std::exception& err) {
          fmt::print(stderr, "depcache serve: warning: the disk tier was not saved: {}\n", err.what());
        }
      });
  const std::unique_ptr<KvEventPublisher> publisher =
      kv_log ? start_publisher(a, tiers, kv_log, loop) : nullptr;
  const std::string name = served.name;
  const std::string chat = served.chat ? served.chat->name() : "none";
  http.ready(std::move(served), loop);
  fmt::print(stderr, "depcache serve: ready, model '{}', chat template {}\n", name, chat);
  std::fflush(stderr);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  fmt::print(stderr, "depcache serve: {}, draining (at most {} s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
             a.drain_s);
  const bool in_time = http.shutdown(std::chrono::steady_clock::now() +
                                     std::chrono::milliseconds(static_cast<int64_t>(a.drain_s * 1000)));
  fmt::print(stderr, "depcache serve: stopped{}\n",
             in_time ? "" : " (requests still running were cancelled)");
}

// route's command line: the served model's options (a router plans requests
// as the replicas do), the replicas, where their events come from, and the
// proxy configuration to write.
struct RouteArgs {
  ServeArgs s;
  std::vector<std::string> replicas;
  RouterOptions router;
  std::string haproxy_config;
  int haproxy_port = 8000;
  std::string haproxy_balance = "overlap";
};

// The key a proxy hashes for consistent hashing: the request's first
// document, else its entity set, else its question or prompt text.
std::string route_key_of(const RagRequest* ctx, const PromptRequest& pr) {
  std::string basis;
  if (ctx && !ctx->documents.empty()) {
    basis =
        "d:" + (ctx->documents.front().id.empty() ? ctx->documents.front().text : ctx->documents.front().id);
  } else if (ctx && !ctx->entities.empty()) {
    std::vector<std::string> names;
    for (const RequestEntity& e : ctx->entities) names.push_back(e.name);
    std::sort(names.begin(), names.end());
    basis = fmt::format("e:{}", fmt::join(names, "\x1f"));
  } else if (ctx) {
    basis = "q:" + ctx->question;
  } else if (pr.chat) {
    for (const ChatMessage& m : pr.messages) basis += m.content + "\x1f";
  } else {
    basis = std::string(pr.prompt);
  }
  return fmt::format("{:016x}", hash_string(basis));
}

// The HAProxy hook of the configuration route writes: before a POST goes to
// a replica, its body is shown to the router; the replica it names is the
// one `use-server` picks (unless down), and the route key it gives is the
// header the backend's consistent hashing reads. No answer in time: the
// request is balanced without them.
std::string haproxy_lua() {
  return R"lua(-- Written by depcache route: asks the router where a request should go.
core.register_action("depcache_route", { "http-req" }, function(txn)
  local body = txn.sf:req_body()
  if body == nil or body == "" then return end
  local client = core.httpclient()
  -- The client's key goes along: the router scores the request in its scope.
  local headers = { ["content-type"] = { "application/json" } }
  local auth = txn.http:req_get_headers()["authorization"]
  if auth ~= nil and auth[0] ~= nil then headers["authorization"] = { auth[0] } end
  local res = client:post{ url = os.getenv("DEPCACHE_ROUTER") .. "/route", body = body,
                           headers = headers, timeout = 1000 }
  if res == nil or res.status ~= 200 or res.body == nil then return end
  local key = string.match(res.body, '"route_key"%s*:%s*"(%x+)"')
  if key then txn.http:req_set_header("X-Depcache-Route", key) end
  local replica = string.match(res.body, '"replica"%s*:%s*"([%w_%.%-]+)"')
  if replica then txn:set_var("txn.depcache_replica", replica) end
end, 0)
)lua";
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  if (const auto failure = write_file_atomic(path, text))
    fail(ErrorKind::InvalidInput, "{}", failure->message);
}

// The HAProxy configuration for the replicas behind this router: `balance`
// overlap (this router's pick, consistent hashing with bounded load when it
// has none), consistent (hashing the router's route key only) or roundrobin.
std::string haproxy_config(const RouteArgs& a, const std::vector<ReplicaAddress>& replicas, int router_port,
                           const std::string& lua_path) {
  std::string servers, rules;
  for (const ReplicaAddress& r : replicas) {
    const std::string hostport = r.url.substr(7);
    // A replica takes this many connections from one address: HAProxy
    // queues the rest rather than passing on 503s.
    servers += fmt::format("  server {} {} check inter 500ms fall 2 rise 1 maxconn {}\n", r.name, hostport,
                           GuardedHttpServer::per_peer_limit(a.s.so.http));
    if (a.haproxy_balance == "overlap")
      rules += fmt::format("  use-server {} if {{ var(txn.depcache_replica) -m str {} }}\n", r.name, r.name);
  }
  const bool ask_router = a.haproxy_balance != "roundrobin";
  return fmt::format(
      "# Written by depcache route: HAProxy in front of depcache serve replicas.\n"
      "global\n"
      "  setenv DEPCACHE_ROUTER http://{rhost}:{rport}\n"
      "  lua-load {lua}\n"
      "  tune.bufsize 1048576\n"
      "  maxconn 4096\n"
      "defaults\n"
      "  mode http\n"
      "  timeout connect 1s\n"
      "  timeout queue 30s\n"
      "  timeout client 300s\n"
      "  timeout server 300s\n"
      "  retries 3\n"
      "  option redispatch 1\n"
      "frontend rag\n"
      "  bind {host}:{port}\n"
      "  option http-buffer-request\n"
      "{ask}"
      "  default_backend replicas\n"
      "backend replicas\n"
      "  balance {balance}\n"
      "  hash-type consistent\n"
      "  hash-balance-factor 125\n"
      "  retry-on conn-failure empty-response response-timeout\n"
      "  http-response set-header X-Depcache-Replica %s\n"
      "{rules}{servers}",
      fmt::arg("lua", lua_path), fmt::arg("rhost", a.s.so.host), fmt::arg("rport", router_port),
      fmt::arg("host", a.s.so.host), fmt::arg("port", a.haproxy_port),
      fmt::arg("ask", ask_router ? "  http-request lua.depcache_route if METH_POST\n" : ""),
      fmt::arg("balance", a.haproxy_balance == "roundrobin" ? "roundrobin" : "hdr(X-Depcache-Route)"),
      fmt::arg("rules", rules), fmt::arg("servers", servers));
}

// Reads the replicas' KV events off the Redis channel until `stop`; on a
// broken connection every replica is read afresh from its summary.
void subscribe_events(const RouteArgs& a, ReplicaRouter& router, const std::atomic<bool>& stop) {
  // The replicas' tier options name their Redis: the same flags here.
  const TierOptions& t = a.s.engine_args.tiers;
  RedisOptions ro = redis_options(t);
  ro.timeout_ms = 1000;
  const std::vector<RedisAddress> nodes = parse_redis_addresses(t.redis.empty() ? t.redis_cluster : t.redis);
  const std::string channel = ro.prefix + "kv-events";
  int64_t refused = 0;
  for (size_t attempt = 0; !stop; ++attempt) {
    const RedisAddress& n = nodes[attempt % nodes.size()];
    RedisConnection c(n.host, n.port, ro);
    const RedisReply ok = c.open(steady_now_ms() + 1000)
                              ? c.command({"SUBSCRIBE", channel}, steady_now_ms() + 1000)
                              : RedisReply();
    if (!ok || ok->type != REDIS_REPLY_ARRAY) {
      fmt::print(stderr, "depcache route: warning: cannot subscribe to {} at {}:{} ({}); retrying\n", channel,
                 n.host, n.port, ok ? "refused" : c.error());
      for (int i = 0; i < 10 && !stop; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    for (const ReplicaAddress& r : router.replicas()) router.mark_unsynced(r.name);  // what we missed
    while (!stop) {
      bool timed_out = false;
      const RedisReply m = c.receive(steady_now_ms() + 200, &timed_out);
      if (timed_out) continue;
      if (!m) break;
      if (m->type != REDIS_REPLY_ARRAY || m->elements != 3 || m->element[2]->type != REDIS_REPLY_STRING)
        continue;
      std::string why;
      if (router.apply_events(std::string_view(m->element[2]->str, m->element[2]->len), &why) ==
              EventOutcome::Refused &&
          refused++ % 100 == 0)
        fmt::print(stderr, "depcache route: warning: KV event batch refused: {} ({} so far)\n", why, refused);
    }
  }
}

// Reads the summary of every replica that needs it, every 200 ms, until `stop`.
void sync_replicas(ReplicaRouter& router, const std::string& operator_key, const std::atomic<bool>& stop) {
  std::set<std::string> warned_key;
  while (!stop) {
    for (const ReplicaAddress& r : router.needing_sync()) {
      httplib::Client client(r.url);
      if (!operator_key.empty()) client.set_bearer_token_auth(operator_key);
      client.set_connection_timeout(std::chrono::milliseconds(500));
      client.set_read_timeout(std::chrono::seconds(2));
      const auto res = client.Get("/v1/cache/summary");
      std::string why;
      if (res && (res->status == 401 || res->status == 403) && warned_key.insert(r.name).second)
        fmt::print(stderr,
                   "depcache route: warning: replica '{}' refuses to show its summary ({}): give the router "
                   "the replicas' --operator-key-file\n",
                   r.name, res->status);
      if (!res || res->status != 200) continue;  // down or not publishing: not routed to until it answers
      if (!router.apply_summary(r.name, res->body, &why))
        fmt::print(stderr, "depcache route: warning: summary of replica '{}' refused: {}\n", r.name, why);
    }
    for (int i = 0; i < 2 && !stop; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// The router of the replicas named on the command line, taking their KV
// events sealed with the deployment's key (or, without one, unsealed).
ReplicaRouter make_router(RouteArgs& a) {
  if (!a.s.engine_args.tiers.remote())
    fail(ErrorKind::InvalidInput,
         "give the Redis the replicas publish their KV events on: --redis or --redis-cluster");
  std::vector<ReplicaAddress> replicas;
  for (const std::string& r : a.replicas) replicas.push_back(parse_replica(r));
  a.router.events_key = deployment_key(a.s.engine_args.tiers);
  if (!a.router.events_key)
    fmt::print(stderr,
               "depcache route: warning: no --cache-key-file: KV events are taken unsealed, and anyone who "
               "can publish on the channel steers routing\n");
  return ReplicaRouter(replicas, a.router);
}

void send_route_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_body(e).dump(), "application/json");
}

// Keys as the replicas': a tenant asks where its own request goes (scored
// against its own scope alone); what shows every replica and tenant is the
// operator's.
void add_router_access(GuardedHttpServer& http, const ServeArgs& s) {
  const OperatorAccess op{s.so.operator_key, !s.so.api_keys.empty()};
  http.set_pre_routing_handler([op, &s](const httplib::Request& req, httplib::Response& res) {
    if (const std::optional<ApiError> e = framing_error(req)) {
      GuardedHttpServer::close_after_response();
      res.set_header("Connection", "close");
      send_route_error(res, *e);
      return httplib::Server::HandlerResponse::Handled;
    }
    std::optional<ApiError> refused;
    if (req.path == "/replicas" || req.path == "/metrics")
      refused = op.refusal(req);
    else if (req.path != "/health" && !s.so.api_keys.empty() && !find_api_key(s.so.api_keys, req))
      refused = ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)",
                         "invalid_request_error", {}, "invalid_api_key");
    if (!refused) return httplib::Server::HandlerResponse::Unhandled;
    send_route_error(res, *refused);
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler(
      [](const httplib::Request&, httplib::Response& res) { GuardedHttpServer::answer_violation(res); });
}

// POST /route's answer: the request planned as a replica would plan it, and
// the replica that holds most of its KV.
nlohmann::json route_decision(const httplib::Request& req, const ServeArgs& s, const PromptSources& ps,
                              Engine& engine, std::mutex& engine_mu, ReplicaRouter& router) {
  const nlohmann::json probe = nlohmann::json::parse(req.body, nullptr, false);
  if (!probe.is_object()) throw ApiError(400, "the body is not a JSON object");
  CompletionRequest cr =
      probe.contains("messages") ? parse_chat_request(req.body, 0) : parse_completion_request(req.body, 0);
  const ApiKey* tenant = find_api_key(s.so.api_keys, req);
  cr.cache_scope = cache_scope_of(tenant ? tenant->cache_namespace : std::string(), cr.cache_salt);
  const PromptRequest pr = prompt_request(cr);
  std::optional<RagRequest> ctx;
  if (cr.rag) ctx = request_context(pr, ps);
  std::string strategy = cr.rag && !cr.rag->strategy.empty() ? cr.rag->strategy : s.so.strategy;
  strategy = std::string(engine_strategy(strategy));
  std::vector<Lookup> lookups;
  {
    std::lock_guard lk(engine_mu);
    lookups = engine.lookups_of(strategy, request_prompt(pr, ps, ctx ? &*ctx : nullptr));
  }
  const std::string key = route_key_of(ctx ? &*ctx : nullptr, pr);
  const ReplicaRouter::Decision d = router.route(lookups, key);
  nlohmann::json held = nlohmann::json::object();
  const std::vector<ReplicaAddress>& replicas = router.replicas();
  for (size_t i = 0; i < replicas.size(); ++i) held[replicas[i].name] = d.matched[i];
  return nlohmann::json{
      {"replica", d.replica}, {"route_key", key}, {"tokens", d.total}, {"held_tokens", held}};
}

// GET /metrics of the router: its event batches by outcome, then the
// connection layer's counters.
std::string router_metrics(const ReplicaRouter& router, const GuardedHttpServer& http) {
  std::string out =
      "# HELP depcache_router_event_batches_total KV event batches by what became of them (applied; stale: "
      "a replay or overtaken by a summary; resync: the replica's summary is read; refused: malformed, "
      "unsealed, forged or out of bounds)\n"
      "# TYPE depcache_router_event_batches_total counter\n";
  const auto counts = router.event_counts();
  for (int o = 0; o < kEventOutcomes; ++o)
    out += fmt::format("depcache_router_event_batches_total{{outcome=\"{}\"}} {}\n",
                       event_outcome_name(static_cast<EventOutcome>(o)), counts[static_cast<size_t>(o)]);
  return out + render_http_metrics(http);
}

// --haproxy-config: the configuration and, beside it, its Lua hook.
void write_haproxy_files(const RouteArgs& a, const std::vector<ReplicaAddress>& replicas, int port) {
  const std::filesystem::path lua = std::filesystem::absolute(a.haproxy_config).replace_extension(".lua");
  write_text(lua, haproxy_lua());
  write_text(a.haproxy_config, haproxy_config(a, replicas, port, lua.string()));
  fmt::print(stderr, "depcache route: HAProxy configuration {} (balance {}, port {}) and its hook {}\n",
             a.haproxy_config, a.haproxy_balance, a.haproxy_port, lua.string());
}

void route(RouteArgs& a) {
  const sigset_t stop_signals = block_stop_signals();
  finish_options(a.s);
  ReplicaRouter router = make_router(a);
  const std::vector<ReplicaAddress>& replicas = router.replicas();

  std::shared_ptr<const Model> model = Model::load(a.s.model_path, {a.s.pool_rows});
  auto tok = std::make_shared<const Tokenizer>(Vocab::from_gguf(model->file()));
  ServedModel served;
  served.tokenizer = tok;
  served.chat = served_chat_format(a.s.chat_template, tok->vocab().chat_template);
  served.prompt = model->config().prompt;
  const Sources sources = load_sources(a.s, *tok, served);
  const ResolvedEngine re = resolve_engine(a.s.engine_args, a.s.so.strategy, model->config(), 16, true);
  EngineOptions eo = re.engine;
  eo.pool_rows = 16;  // plans only: no request runs here
  eo.tokenizer = tok;
  Engine engine(model, eo);
  std::mutex engine_mu;  // the engine is not thread-safe
  const PromptSources ps{tok.get(),    served.chat,   served.corpus,
                         served.graph, served.prompt, a.s.so.special_in_text};

  // The connection layer of the replicas, with the same limits.
  GuardedHttpServer http(a.s.so.http);
  add_router_access(http, a.s);
  http.Post("/route", [&](const httplib::Request& req, httplib::Response& res) {
    try {
      res.set_content(route_decision(req, a.s, ps, engine, engine_mu, router).dump(), "application/json");
    } catch (const ApiError& e) {
      send_route_error(res, e);
    } catch (const std::exception& e) {
      send_route_error(res, ApiError(400, e.what()));
    }
  });
  http.Get("/replicas", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(router.state_json(), "application/json");
  });
  http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(router_metrics(router, http), "text/plain; version=0.0.4");
  });
  http.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  const int port = a.s.so.port == 0 ? http.bind_to_any_port(a.s.so.host)
                                    : (http.bind_to_port(a.s.so.host, a.s.so.port) ? a.s.so.port : -1);
  if (port < 0) fail(ErrorKind::InvalidInput, "cannot listen on {}:{}", a.s.so.host, a.s.so.port);
  if (!a.haproxy_config.empty()) write_haproxy_files(a, replicas, port);
  // The ready line first: it names the router's own address.
  fmt::print(stderr, "depcache route: ready on http://{}:{} for {} replicas\n", a.s.so.host, port,
             replicas.size());
  std::fflush(stderr);
  std::atomic<bool> stop{false};
  std::thread events([&] { subscribe_events(a, router, stop); });
  std::thread sync([&] { sync_replicas(router, a.s.so.operator_key, stop); });
  std::thread listener([&] { http.listen_after_bind(); });
  int sig = 0;
  sigwait(&stop_signals, &sig);
  stop = true;
  http.stop();
  listener.join();
  events.join();
  sync.join();
  fmt::print(stderr, "depcache route: stopped\n");
}

// Who may call what: tenants' keys and the operator's.
void add_access_options(CLI::App* cmd, ServeArgs& a) {
  cmd->add_option(
      "--api-key", a.api_key,
      "Require 'Authorization: Bearer KEY' (visible in the process list: prefer --api-key-file or "
      "the DEPCACHE_API_KEY environment variable)");
  cmd->add_option(
         "--api-key-file", a.api_key_file,
         "Keys clients may present, one per line: 'KEY' (KV reused among that key's requests only) or "
         "'KEY NAMESPACE' (keys naming the same namespace share their cache)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--operator-key-file", a.operator_key_file,
                  "The operator's key (the file's first line, 16 characters or more): what shows every "
                  "tenant at once (/metrics, /v1/cache/summary, a router's /replicas) needs it once any key "
                  "is set; a router sends it to read the replicas' summaries")
      ->check(CLI::ExistingFile);
}

// What a client may send and how long it may take (every limit answers with its HTTP code).
void add_http_limits(CLI::App* cmd, ServeArgs& a) {
  cmd->add_option("--max-body", a.so.http.max_body_bytes,
                  "Largest request body in bytes, whatever its transfer encoding (larger: 413)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 30));
  cmd->add_option("--max-header-bytes", a.so.http.max_header_bytes,
                  "Largest request line and headers together, in bytes (larger: 431)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{256}, size_t{1} << 24));
  cmd->add_option("--max-headers", a.so.http.max_header_lines, "Most header lines of a request (more: 431)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{100000}));
  cmd->add_option("--request-timeout", a.request_timeout_ms,
                  "Milliseconds a client has to send a whole request, from its first byte (slower: 408)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  cmd->add_option("--keep-alive-timeout", a.keep_alive_ms,
                  "Milliseconds an idle connection is kept open for its next request")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
  cmd->add_option("--write-timeout", a.write_timeout_ms,
                  "Milliseconds a response may wait for a client that does not read it (then the request is "
                  "cancelled)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  cmd->add_option(
         "--http-threads", a.so.http.max_connections,
         "Connections served at once, a thread each (a streaming client holds one); one more gets an "
         "immediate 503 with Retry-After")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{900}));
  cmd->add_option(
         "--max-connections-per-peer", a.so.http.max_connections_per_peer,
         "Connections one IP address may hold at once; more get an immediate 503 (0: half of "
         "--http-threads; as many as --http-threads: no limit). Behind a proxy every client shares its "
         "address: depcache route's HAProxy configuration caps its connections to each replica at the "
         "same number")
      ->capture_default_str()
      ->check(CLI::Range(size_t{0}, size_t{900}));
}

// Where rag.retrieve searches, staged search with speculation, SubGCache's batching.
void add_retrieval_options(CLI::App* cmd, ServeArgs& a) {
  cmd->add_option("--kg", a.kg_path,
                  "Knowledge graph (.dkg) that requests may retrieve entities and paths from");
  cmd->add_option("--corpus", a.corpus_path, "Document corpus that requests may retrieve chunks from (BM25)");
  cmd->add_option("--corpus-format", a.corpus_format, "Format of --corpus: auto, musique, hotpotqa, jsonl")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "musique", "hotpotqa", "jsonl"}));
  cmd->add_option("--search-stages", a.so.search.stages,
                  "Stages of a corpus search (each stage's top-k is what --speculate starts a prefill from)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  cmd->add_option(
         "--search-stage-order", a.so.search.order,
         "How a corpus search is staged: documents (chunk-id ranges, like shards searched in turn) or "
         "terms (the rarest query terms first, over every chunk); default documents")
      ->transform(CLI::CheckedTransformer(stage_orders()));
  cmd->add_flag("--speculate", a.so.search.speculate,
                "Dynamic speculative pipelining (RAGCache): prefill from each stage's top-k while the search "
                "goes on, keep it when the final list is the same (needs --search-stages 2 or more)");
  cmd->add_option("--max-prefill-bs", a.so.search.max_prefill_bs,
                  "Speculative prefills in flight at once, over every request")
      ->capture_default_str()
      ->check(CLI::Range(size_t{0}, size_t{1} << 20));
  cmd->add_option("--speculative-piece-tokens", a.so.search.piece_tokens,
                  "Prompt tokens a speculative prefill computes per step, so that stopping it takes effect "
                  "soon (0: the step's whole budget)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--search-stage-latency-ms", a.stage_latency_ms,
                  "Added to every search stage: stands for a retriever slower than in-memory BM25 (a remote "
                  "vector database), to measure how much of its time speculation hides")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 60000.0));
  cmd->add_option(
         "--strategy", a.so.strategy,
         fmt::format("Reuse strategy of requests that name none: {} (subgcache: GraphRAG requests batched "
                     "and clustered by subgraph, one prefill per cluster)",
                     fmt::join(request_strategy_names(), ", ")))
      ->capture_default_str()
      ->check(CLI::IsMember(request_strategy_names()));
  add_subgcache_options(cmd, a.so.subgcache.subgcache);
  cmd->add_option("--query-batch", a.so.subgcache.subgcache.batch,
                  "subgcache: the most requests clustered together")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--batch-window-ms", a.batch_window_ms,
                  "subgcache: how long a batch's first request waits for others before its batch is "
                  "clustered")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{60000}));
}

}  // namespace

void add_serve_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("serve", "Serve a GGUF model over an OpenAI-compatible HTTP API");
  static ServeArgs a;
  add_model_option(*cmd, a.model_path)->required();
  cmd->add_option("--host", a.so.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a.so.port, "Port to listen on (0: any free port, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  add_access_options(cmd, a);
  cmd->add_flag("--allow-special-tokens", a.so.special_in_text,
                "Special-token strings in prompts and messages become control tokens (trusted clients only; "
                "by default they are plain text)");
  add_http_limits(cmd, a);
  cmd->add_option("--max-queue", a.so.max_queue,
                  "Requests waiting for the engine at most; more are refused with 429 and Retry-After (0: no "
                  "limit)")
      ->capture_default_str();
  cmd->add_option("--chat-template", a.chat_template,
                  "Chat format of /v1/chat/completions (default: the model's own tokenizer.chat_template, "
                  "run as Jinja2 runs it): " +
                      fmt::format("{}", fmt::join(chat_family_names(), ", ")))
      ->check(CLI::IsMember(chat_family_names()));
  add_retrieval_options(cmd, a);
  add_engine_options(*cmd, a.engine_args);
  cmd->add_option("-c,--ctx-size", a.pool_rows, "Rows of the KV pool shared by running requests")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 24));
  cmd->add_option(
         "--drain-seconds", a.drain_s,
         "On SIGTERM/SIGINT: how long requests in flight may take to finish before they are cancelled")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_flag("--kv-events", a.kv_events,
                "Publish what the cache stores and evicts (content keys of spans: prefix chains, chunks, KG "
                "subtrees) on the remote tier's Redis, channel <prefix>kv-events, and answer GET "
                "/v1/cache/summary: what a cache-aware router (depcache route) reads");
  cmd->add_option(
         "--kv-events-redis", a.kv_events_redis,
         "Publish the KV events on this Redis (host:port, or nodes of a cluster host:port,...) instead "
         "of the remote tier's (a replica that shares no KV still tells a router what it holds)")
      ->check(parses_with(parse_redis_addresses));
  cmd->add_option("--replica-name", a.replica_name,
                  "This replica's name in its KV events (default: host:port)");
  cmd->add_option("--kv-events-block", a.kv_events_block, "Tokens per block of the KV events' content keys")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->callback([] { serve(a); });
}

void add_route_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "route", "Route requests to serve replicas by the KV they hold: the decision service a proxy asks");
  static RouteArgs a;
  a.s.so.port = 8090;
  add_model_option(*cmd, a.s.model_path,
                   "GGUF model file (the replicas'): requests are planned as they plan them")
      ->required();
  cmd->add_option("--host", a.s.so.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a.s.so.port, "Port to listen on (0: any free port, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  add_access_options(cmd, a.s);
  cmd->add_option("--replica", a.replicas,
                  "A replica as NAME=http://host:port (its serve --replica-name); repeat")
      ->required()
      ->check(parses_with(parse_replica));
  cmd->add_option("--kv-events-block", a.router.block_tokens, "The replicas' --kv-events-block")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--load-tokens", a.router.load_tokens,
                  "Tokens of work each request in a replica's queue counts for against the tokens a request "
                  "would compute there (0: the mean prompt routed so far)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option(
      "--haproxy-config", a.haproxy_config,
      "Write an HAProxy configuration for these replicas here (and its Lua hook beside it, .lua)");
  cmd->add_option("--haproxy-port", a.haproxy_port, "The port HAProxy listens on, in that configuration")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  cmd->add_option(
         "--haproxy-balance", a.haproxy_balance,
         "overlap: this router picks the replica (consistent hashing with bounded load when it knows "
         "none); consistent: hashing the router's route key (first document or entity set) with "
         "bounded load; roundrobin")
      ->capture_default_str()
      ->check(CLI::IsMember({"overlap", "consistent", "roundrobin"}));
  add_http_limits(cmd, a.s);
  cmd->add_option("--chat-template", a.s.chat_template, "As the replicas' serve --chat-template")
      ->check(CLI::IsMember(chat_family_names()));
  add_retrieval_options(cmd, a.s);
  add_engine_options(*cmd, a.s.engine_args);
  cmd->add_option("-c,--ctx-size", a.s.pool_rows, "As the replicas' serve --ctx-size")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 24));
  cmd->callback([] { route(a); });
}

}  // namespace depcache::cli
