// The failpoint registry and its spec syntax (inject/failpoint).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "zt/fail/catalog.h"
#include "zt/fail/failpoint.h"

namespace zt::fail {
namespace {

Spec parse_ok(const std::string& text) {
  Spec s;
  Status st = parse_spec(text, &s);
  EXPECT_TRUE(st.ok()) << st.message();
  return s;
}

std::string parse_error(const std::string& text) {
  std::vector<Spec> s;
  Status st = parse_specs(text, &s);
  EXPECT_FALSE(st.ok()) << text;
  return st.message();
}

TEST(FailpointSyntax, ParsesTheFailRsForms) {
  Spec s = parse_ok("host.epoch_leak=20%3*print(alive)->return(pow2)");
  EXPECT_EQ(s.name, "host.epoch_leak");
  ASSERT_EQ(s.terms.size(), 2u);
  EXPECT_DOUBLE_EQ(s.terms[0].probability, 0.2);
  EXPECT_EQ(s.terms[0].count, 3);
  EXPECT_EQ(s.terms[0].action, Action::Print);
  EXPECT_EQ(s.terms[0].arg, "alive");
  EXPECT_EQ(s.terms[1].action, Action::Return);
  EXPECT_EQ(s.terms[1].arg, "pow2");
  EXPECT_EQ(s.terms[1].count, -1);
  Spec c = parse_ok("comm.hang[step>=3, rank=1, call%2=0]=1*return");
  ASSERT_EQ(c.when.size(), 3u);
  EXPECT_EQ(c.when[0].field, Condition::Field::Step);
  EXPECT_EQ(c.when[0].op, Condition::Op::Ge);
  EXPECT_EQ(c.when[0].rhs, 3);
  EXPECT_EQ(c.when[2].op, Condition::Op::Mod);
  EXPECT_EQ(c.when[2].modulus, 2);
  std::vector<Spec> two;
  ASSERT_TRUE(parse_specs("zero.norm_on_device=return; config.max_iters=return(32)\n", &two).ok());
  EXPECT_EQ(two.size(), 2u);
}

TEST(FailpointSyntax, BadSpecsSayWhatIsWrong) {
  EXPECT_NE(parse_error("zero.nrom=return").find("unknown fault 'zero.nrom'"), std::string::npos);
  EXPECT_NE(parse_error("zero.norm_on_device").find("expected '='"), std::string::npos);
  EXPECT_NE(parse_error("zero.norm_on_device=explode").find("unknown action 'explode'"), std::string::npos);
  EXPECT_NE(parse_error("zero.norm_on_device=150%return").find("probability"), std::string::npos);
  EXPECT_NE(parse_error("zero.norm_on_device=sleep").find("milliseconds"), std::string::npos);
  EXPECT_NE(parse_error("zero.norm_on_device[stp=1]=return").find("unknown field 'stp'"), std::string::npos);
  EXPECT_NE(parse_error("zero.norm_on_device[step>=1=return").find("missing ']'"), std::string::npos);
  EXPECT_NE(parse_error("zero.norm_on_device=return(x").find("missing ')'"), std::string::npos);
}

TEST(FailpointSyntax, NothingMayFollowAnAction) {
  // The argument runs to its matching ')': anything after it is a syntax error, not part of the argument.
  const std::string e = parse_error("host.epoch_leak=return(pow2)(x)");
  EXPECT_NE(e.find("unexpected '(x)' after return(pow2)"), std::string::npos) << e;
  EXPECT_NE(parse_error("host.epoch_leak=return(pow2) x").find("unexpected ' x'"), std::string::npos);
  EXPECT_NE(parse_error("ckpt.torn_write=panic(a))").find("unexpected ')'"), std::string::npos);
  EXPECT_NE(parse_error("zero.norm_on_device=return->").find("no action"), std::string::npos);
  // Messages may hold parentheses and arrows: only the outer pair is the argument.
  Spec s = parse_ok("host.epoch_leak=print(a (b) -> c)->return(fork)");
  ASSERT_EQ(s.terms.size(), 2u);
  EXPECT_EQ(s.terms[0].arg, "a (b) -> c");
  EXPECT_EQ(s.terms[1].arg, "fork");
  EXPECT_EQ(parse_ok("ckpt.between_writes[call=4]=panic(killed (by test))").terms[0].arg, "killed (by test)");
}

TEST(FailpointSyntax, ReturnArgumentsAreCheckedAgainstTheCatalog) {
  // What each site reads from return(ARG): accepted as written, and the default when absent.
  for (const char* good : {"host.epoch_leak=return", "host.epoch_leak=return()", "host.epoch_leak=return(pinned)",
                           "host.epoch_leak=return(pow2)", "host.epoch_leak=return(fork)", "data.parallel_drop=return(0)",
                           "data.parallel_drop=return(100)", "config.max_iters=return(1)", "config.max_iters=return(32)",
                           "zero.grad_partition_stays_on_device=return(0)", "zero.norm_on_device=return",
                           "comm.hang[rank=1]=1*return", "host.epoch_leak=20%3*print(alive)->return(pow2)"})
    parse_ok(good);
  // One line naming the fault, the argument and what is allowed.
  struct Bad {
    const char* spec;
    std::vector<const char*> words;
  };
  for (const Bad& b : std::vector<Bad>{
           {"host.epoch_leak=return(bogus)", {"host.epoch_leak", "variant 'bogus'", "pinned, pow2 or fork"}},
           {"host.epoch_leak=return(Pinned)", {"variant 'Pinned'", "pinned, pow2 or fork"}},
           {"data.parallel_drop=return(101)", {"data.parallel_drop", "percentage '101'", "0 to 100"}},
           {"data.parallel_drop=return(half)", {"percentage 'half'", "0 to 100"}},
           {"data.parallel_drop=return(-5)", {"percentage '-5'"}},
           {"config.max_iters=return(0)", {"config.max_iters", "step count '0'", "at least 1"}},
           {"config.max_iters=return(99999999999999999999)", {"step count '99999999999999999999'"}},
           {"config.max_iters=return( 8)", {"step count ' 8'"}},
           {"zero.grad_partition_stays_on_device=return(last)", {"module index 'last'", "at least 0"}},
           {"zero.norm_on_device=return(1)", {"zero.norm_on_device", "takes no argument", "'1'"}},
           {"comm.hang=return(rank1)", {"comm.hang", "takes no argument", "'rank1'"}},
           {"host.epoch_leak=print(x)->return(bogus)", {"variant 'bogus'"}},
           {"comm.hang=pause(3)", {"pause takes no argument"}},
           {"comm.hang=off(now)", {"off takes no argument"}},
       }) {
    const std::string e = parse_error(b.spec);
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    EXPECT_NE(e.find(std::string("'") + b.spec + "'"), std::string::npos) << e;
    for (const char* w : b.words) EXPECT_NE(e.find(w), std::string::npos) << b.spec << ": wanted '" << w << "' in: " << e;
  }
}

TEST(FailpointCatalog, EachEntryDeclaresItsArgument) {
  int with_arg = 0;
  for (const auto& e : catalog()) {
    SCOPED_TRACE(e.name);
    EXPECT_EQ(e.arg == nullptr, e.arg_ok == nullptr);
    EXPECT_EQ(e.arg == nullptr, e.arg_allowed == nullptr);
    EXPECT_EQ(e.arg == nullptr, e.arg_syntax == nullptr);
    EXPECT_TRUE(return_arg_problem(e, "").empty()) << "no argument is always the default";
    if (!e.arg) {
      EXPECT_NE(return_arg_problem(e, "x").find("takes no argument"), std::string::npos);
      continue;
    }
    ++with_arg;
    EXPECT_NE(std::string(e.arg_allowed).find("default"), std::string::npos) << "the default is said";
  }
  EXPECT_EQ(with_arg, 4);  // zero.grad_partition_stays_on_device, host.epoch_leak, data.parallel_drop, config.max_iters
  EXPECT_TRUE(return_arg_problem(*find_fault("host.epoch_leak"), "fork").empty());
  EXPECT_FALSE(return_arg_problem(*find_fault("host.epoch_leak"), "spoon").empty());
}

TEST(FailpointCatalog, EveryEntryIsDescribedAndUnique) {
  std::set<std::string> names;
  for (const auto& e : catalog()) {
    EXPECT_TRUE(names.insert(e.name).second) << e.name;
    EXPECT_GT(std::string(e.mechanism).size(), 20u) << e.name;
    EXPECT_EQ(find_fault(e.name), &e);
  }
  for (const char* required : {"zero.norm_on_device", "zero.grad_partition_stays_on_device", "optim.device_only_kernels",
                               "ckpt.gather_on_device", "host.epoch_leak", "data.parallel_drop", "config.max_iters",
                               "comm.hang", "comm.rank_exit", "ckpt.torn_write"})
    EXPECT_NE(find_fault(required), nullptr) << required;
}

TEST(Failpoint, NothingConfiguredNothingFires) {
  clear();
  EXPECT_FALSE(any_configured());
  EXPECT_FALSE(ZT_FAIL("zero.norm_on_device", Context{}));
}

TEST(Failpoint, CountsThenChainsAsFailRs) {
  std::vector<Spec> s;
  ASSERT_TRUE(parse_specs("config.max_iters=2*return(3)->return(5)", &s).ok());
  Scope scope(s, 1);
  auto a = eval("config.max_iters", Context{});
  auto b = eval("config.max_iters", Context{});
  auto c = eval("config.max_iters", Context{});
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->arg, "3");
  EXPECT_EQ(b->arg, "3");
  EXPECT_EQ(c->arg, "5");
  EXPECT_EQ(fired_count("config.max_iters"), 3);
}

TEST(Failpoint, ConditionsSelectStepRankAndCall) {
  std::vector<Spec> s;
  ASSERT_TRUE(parse_specs("comm.hang[step>=2,rank=1]=return;comm.rank_exit[call=3]=return", &s).ok());
  Scope scope(s, 1);
  EXPECT_FALSE(eval("comm.hang", Context{1, 1, -1, -1, nullptr}));
  EXPECT_FALSE(eval("comm.hang", Context{0, 2, -1, -1, nullptr}));
  EXPECT_TRUE(eval("comm.hang", Context{1, 2, -1, -1, nullptr}));
  EXPECT_FALSE(eval("comm.hang", Context{-1, -1, -1, -1, nullptr}));  // a site that does not know: no match
  EXPECT_FALSE(eval("comm.rank_exit", Context{0, -1, -1, -1, nullptr}));
  EXPECT_FALSE(eval("comm.rank_exit", Context{0, -1, -1, -1, nullptr}));
  EXPECT_TRUE(eval("comm.rank_exit", Context{0, -1, -1, -1, nullptr}));
  EXPECT_FALSE(eval("comm.rank_exit", Context{0, -1, -1, -1, nullptr}));
  // Calls are counted per rank: rank 1's third call fires too.
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(eval("comm.rank_exit", Context{1, -1, -1, -1, nullptr}));
  EXPECT_TRUE(eval("comm.rank_exit", Context{1, -1, -1, -1, nullptr}));
}

TEST(Failpoint, ThreadPositionFillsUnknownFields) {
  std::vector<Spec> s;
  ASSERT_TRUE(parse_specs("comm.hang[epoch=2]=return", &s).ok());
  Scope scope(s, 1);
  set_thread_position(Context{0, 10, 0, 2, nullptr});
  EXPECT_TRUE(eval("comm.hang", Context{}));
  set_thread_position(Context{});
  EXPECT_FALSE(eval("comm.hang", Context{}));
}

std::vector<int> draws(uint64_t seed, int rank) {
  std::vector<Spec> s;
  EXPECT_TRUE(parse_specs("host.epoch_leak=30%return", &s).ok());
  Scope scope(s, seed);
  std::vector<int> out;
  for (int i = 0; i < 200; ++i) out.push_back(eval("host.epoch_leak", Context{rank, -1, -1, -1, nullptr}) ? 1 : 0);
  return out;
}

TEST(Failpoint, ProbabilityDrawsRepeatFromTheSeed) {
  const auto a = draws(7, 0), b = draws(7, 0), c = draws(8, 0), d = draws(7, 1);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  int fired = 0;
  for (int x : a) fired += x;
  EXPECT_GT(fired, 30);  // 30% of 200 = 60, within a wide band
  EXPECT_LT(fired, 95);
}

// fail-rs's Action::get_task takes a count only once the probability draw passed:
// "30%2*return(pow2)->return(fork)" returns pow2 at the first two calls where a plain "30%return"
// fires, and fork at every other call (a miss falls through to the next term). (A failed draw
// used to take the count too.)
TEST(Failpoint, ACountIsTakenOnlyWhenTheDrawPasses) {
  const std::vector<int> plain = draws(7, 0);
  std::vector<Spec> s;
  ASSERT_TRUE(parse_specs("host.epoch_leak=30%2*return(pow2)->return(fork)", &s).ok());
  Scope scope(s, 7);
  int a_seen = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    auto f = eval("host.epoch_leak", Context{0, -1, -1, -1, nullptr});
    ASSERT_TRUE(f) << "call " << i + 1;  // a miss falls through to the chain's unconditional tail
    const bool first_term = a_seen < 2 && plain[i] == 1;
    EXPECT_EQ(f->arg, first_term ? "pow2" : "fork") << "call " << i + 1;
    a_seen += f->arg == "pow2";
  }
  EXPECT_EQ(a_seen, 2);
}

// `call=N` is the Nth evaluation of the site on that rank, whatever the site's other specs did (an
// earlier spec that fired stopped the later ones from counting: [call=5] fired at the 8th).
TEST(Failpoint, CallCountsEveryEvaluationAcrossSpecs) {
  std::vector<Spec> s;
  ASSERT_TRUE(parse_specs("config.max_iters[call<=3]=return(1);config.max_iters[call=5]=return(5)", &s).ok());
  Scope scope(s, 1);
  std::vector<std::string> got;
  for (int i = 0; i < 8; ++i) {
    auto f = eval("config.max_iters", Context{0, -1, -1, -1, nullptr});
    got.push_back(f ? f->arg : "-");
  }
  EXPECT_EQ(got, (std::vector<std::string>{"1", "1", "1", "-", "5", "-", "-", "-"}));
}

TEST(Failpoint, PauseHoldsUntilReconfigured) {
  std::vector<Spec> s;
  ASSERT_TRUE(parse_specs("comm.hang=pause", &s).ok());
  configure(s, 1);
  std::atomic<bool> done{false};
  std::thread t([&] {
    eval("comm.hang", Context{});
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(done.load());
  clear();
  t.join();
  EXPECT_TRUE(done.load());
}

TEST(Failpoint, PanicAbortsTheProcess) {
  std::vector<Spec> s;
  ASSERT_TRUE(parse_specs("ckpt.between_writes=panic(boom)", &s).ok());
  EXPECT_DEATH(
      {
        configure(s, 1);
        eval("ckpt.between_writes", Context{});
      },
      "failpoint ckpt.between_writes panicked: boom");
  clear();
}

}  // namespace
}  // namespace zt::fail
