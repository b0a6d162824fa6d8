// Differential test of the mangled-name parser (core/inference/kernel_signature.h)
// against two oracles that share no code with it:
//
// 1. The GNU demangler (abi::__cxa_demangle) over the kernel names of the
//    CUDA toolkit's own libraries (core/inference/testdata/kernel_names.txt.gz, made
//    by scripts/kernel_corpus.sh). For each name, the structural parse alone
//    (ClassifyMangledParams, without the cross-check ParseKernelSignature
//    adds) against the demangler's printed parameter list: the counts must
//    agree, every kRead must print as a pointer to const, every kNone as an
//    arithmetic builtin, and every Pointees::kConst as a pointer to pointers
//    to const. A read the demangler contradicts would be a missed write.
// 2. A generator of random C++ kernel signatures (pointers, const, volatile,
//    references, class templates, nested names, function pointers, arrays,
//    builtins, kernel templates with their parameters `T_` used in the
//    parameter list) that mangles each one itself, with the ABI's
//    substitution table (`S_`, `S0_`, ...), and knows the right
//    classification of every parameter from the C++ type it built. The
//    parser must give exactly that classification (or fail to parse); the
//    demangler must print the generated name with that many parameters, the
//    reads as pointers to const and the nones as builtins (which checks the
//    generator against GNU).
//
// The counts are printed, so a reader sees the coverage. By hand, over any
// corpus (one name per line, gzip-compressed):
//   bazel run //core/inference:kernel_signature_differential_test -- FILE.gz
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/inference/kernel_signature.h"
#include "gtest/gtest.h"

namespace stensor {
namespace {

using kernel_signature_internal::ClassifyMangledParams;

std::string g_corpus_path;  // from the command line

// ---- What the demangler printed, read independently of the parser ----

std::string_view Trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

bool StripSuffixWord(std::string_view* s, std::string_view word) {
  if (s->size() < word.size() || s->substr(s->size() - word.size()) != word) {
    return false;
  }
  const std::string_view rest = s->substr(0, s->size() - word.size());
  if (!rest.empty() && rest.back() != ' ' && rest.back() != '*' && rest.back() != '&') {
    return false;  // "xconst" is a name, not a qualifier
  }
  *s = Trim(rest);
  return true;
}

// Where the ")" that ends `text` opens, or npos.
size_t MatchingOpen(std::string_view text) {
  int depth = 0;
  for (size_t i = text.size(); i-- > 0;) {
    if (text[i] == ')') ++depth;
    if (text[i] == '(' && --depth == 0) return i;
  }
  return std::string_view::npos;
}

// The printed parameter types of a demangled function, or nullopt when the
// text does not end in a parameter list. Brackets are counted from the end:
// the last top-level "(...)" is the list, whatever the name before it
// holds; inside it, commas at depth 0 of (), [], {} and <> separate types
// ('<' and '>' only count where they are not operators: "operator<" does not
// occur in a parameter type, but "(a<b)" in an expression argument does,
// so '>' is only matched against an open '<').
std::optional<std::vector<std::string>> PrintedParams(std::string_view text) {
  while (!text.empty() && text.back() == ']') {  // " [clone .cold]"
    const size_t clone = text.rfind(" [clone ");
    if (clone == std::string_view::npos) return std::nullopt;
    text = text.substr(0, clone);
  }
  text = Trim(text);
  while (StripSuffixWord(&text, "const") || StripSuffixWord(&text, "volatile") ||
         StripSuffixWord(&text, "&&") || StripSuffixWord(&text, "&")) {
  }
  if (text.empty() || text.back() != ')') return std::nullopt;
  std::string_view list;
  for (;;) {
    const size_t open = MatchingOpen(text);
    if (open == std::string_view::npos) return std::nullopt;
    list = text.substr(open + 1, text.size() - open - 2);
    // A function returning a pointer or reference to a function prints its
    // own parameters inside the declarator: "void (&f<A>(A&))()". The
    // group before the last one is then the declarator; its last group is
    // the list.
    const std::string_view before = Trim(text.substr(0, open));
    if (before.empty() || before.back() != ')') break;
    const size_t declarator = MatchingOpen(before);
    if (declarator == std::string_view::npos) break;
    const std::string_view inner =
        Trim(before.substr(declarator + 1, before.size() - declarator - 2));
    if (inner.empty() || (inner.front() != '*' && inner.front() != '&') || inner.back() != ')') {
      break;
    }
    text = inner;
  }
  std::vector<std::string> params;
  if (Trim(list).empty()) return params;
  std::string stack;
  size_t start = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == '(' || c == '[' || c == '{' || c == '<') {
      stack.push_back(c);
    } else if (c == ')' || c == ']' || c == '}') {
      while (!stack.empty() && stack.back() == '<') stack.pop_back();
      if (stack.empty()) return std::nullopt;
      stack.pop_back();
    } else if (c == '>') {
      if (!stack.empty() && stack.back() == '<') stack.pop_back();
    } else if (c == ',' && stack.empty()) {
      params.emplace_back(Trim(list.substr(start, i - start)));
      start = i + 1;
    }
  }
  params.emplace_back(Trim(list.substr(start)));
  return params;
}

// "T const*", "T* const*", "T const volatile* restrict": a pointer whose
// pointee is const-qualified. Not "T const (*) [4]" or "void (*)(T const*)";
// but "T (* const*) [4]" and "void (* const*)()", pointers to const
// pointers to arrays or functions, are.
bool PointerToConst(std::string_view type) {
  type = Trim(type);
  if (!type.empty() && (type.back() == ']' || type.back() == ')')) {
    // The declarator is the first group that opens with a pointer.
    const size_t open = type.find("(*");
    if (open == std::string_view::npos) return false;
    const size_t close = type.find(')', open);
    if (close == std::string_view::npos) return false;
    type = type.substr(open + 1, close - open - 1);
    if (type.find_first_of("()[]<>") != std::string_view::npos) return false;
  }
  while (StripSuffixWord(&type, "restrict") || StripSuffixWord(&type, "const") ||
         StripSuffixWord(&type, "volatile")) {
  }
  if (type.empty() || type.back() != '*') return false;
  type = Trim(type.substr(0, type.size() - 1));
  bool is_const = false;
  for (;;) {
    if (StripSuffixWord(&type, "const")) {
      is_const = true;
    } else if (!StripSuffixWord(&type, "volatile") && !StripSuffixWord(&type, "restrict")) {
      return is_const;
    }
  }
}

// "T const* const*", "T const**", "T const* const&": the entries of the
// table (what the pointer or reference refers to) point to const.
bool PointerToPointerToConst(std::string_view type) {
  type = Trim(type);
  while (StripSuffixWord(&type, "restrict") || StripSuffixWord(&type, "const") ||
         StripSuffixWord(&type, "volatile")) {
  }
  if (type.empty() || (type.back() != '*' && type.back() != '&')) return false;
  type.remove_suffix(1);
  if (!type.empty() && type.back() == '&') type.remove_suffix(1);  // "&&"
  return PointerToConst(type);
}

// The arithmetic builtins as GNU prints them (and nullptr_t): what kNone
// promises a parameter is.
bool ArithmeticBuiltin(std::string_view type) {
  static const auto* const names = new std::set<std::string_view>{"bool",
                                                                  "char",
                                                                  "signed char",
                                                                  "unsigned char",
                                                                  "short",
                                                                  "unsigned short",
                                                                  "int",
                                                                  "unsigned int",
                                                                  "long",
                                                                  "unsigned long",
                                                                  "long long",
                                                                  "unsigned long long",
                                                                  "__int128",
                                                                  "unsigned __int128",
                                                                  "float",
                                                                  "double",
                                                                  "long double",
                                                                  "__float128",
                                                                  "wchar_t",
                                                                  "char8_t",
                                                                  "char16_t",
                                                                  "char32_t",
                                                                  "decltype(nullptr)",
                                                                  "half",
                                                                  "_Float16",
                                                                  "_Float32",
                                                                  "_Float64",
                                                                  "_Float128",
                                                                  "std::bfloat16_t",
                                                                  "__bf16"};
  // A template parameter bound to `const float` prints as "float const".
  while (StripSuffixWord(&type, "const") || StripSuffixWord(&type, "volatile")) {
  }
  return names->count(Trim(type)) != 0;
}

struct Demangled {
  std::string text;
  std::vector<std::string> params;
};

std::optional<Demangled> Demangle(const std::string& name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(
      abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), &std::free);
  if (out == nullptr || status != 0) return std::nullopt;
  std::optional<std::vector<std::string>> params = PrintedParams(out.get());
  if (!params) return std::nullopt;
  return Demangled{out.get(), std::move(*params)};
}

// Why the parser's answer for `name` contradicts what GNU printed, or "".
std::string Contradiction(const std::vector<ParamAccess>& params,
                          const std::vector<Pointees>& pointees, const Demangled& d) {
  if (params.size() != d.params.size()) {
    return absl::StrCat(params.size(), " parameters parsed, ", d.params.size(), " printed");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i] == ParamAccess::kRead && !PointerToConst(d.params[i])) {
      return absl::StrCat("parameter ", i, " read, printed ", d.params[i]);
    }
    if (params[i] == ParamAccess::kNone && !ArithmeticBuiltin(d.params[i])) {
      return absl::StrCat("parameter ", i, " none, printed ", d.params[i]);
    }
    if (pointees[i] == Pointees::kConst && !PointerToPointerToConst(d.params[i])) {
      return absl::StrCat("parameter ", i, " a table of const, printed ", d.params[i]);
    }
  }
  return "";
}

// ---- 1. The CUDA toolkit's names ----

std::vector<std::string> ReadCorpus(const std::string& path) {
  // gzip is on every machine that runs the suite; zlib's headers need not be.
  std::vector<std::string> names;
  const std::string command = absl::StrCat("gzip -dc '", path, "'");
  FILE* in = popen(command.c_str(), "r");
  if (in == nullptr) return names;
  std::string line;
  for (int c; (c = std::fgetc(in)) != EOF;) {
    if (c != '\n') {
      line.push_back(static_cast<char>(c));
    } else if (!line.empty()) {
      names.push_back(std::move(line));
      line.clear();
    }
  }
  if (!line.empty()) names.push_back(line);
  if (pclose(in) != 0) names.clear();
  return names;
}

TEST(KernelSignatureDifferentialTest, CudaToolkitNamesAgreeWithGnu) {
  ASSERT_FALSE(g_corpus_path.empty()) << "usage: TEST CORPUS.txt.gz";
  const std::vector<std::string> names = ReadCorpus(g_corpus_path);
  ASSERT_GT(names.size(), 1000u) << "cannot read " << g_corpus_path;
  size_t parsed = 0, demangled = 0, compared = 0, agreed = 0;
  size_t fallbacks = 0, reads = 0, nones = 0, const_tables = 0;
  size_t reads_missed = 0;  // read-write where GNU prints a pointer to const
  size_t contradictions = 0;
  for (const std::string& name : names) {
    std::vector<Pointees> pointees;
    const std::optional<std::vector<ParamAccess>> params = ClassifyMangledParams(name, &pointees);
    const std::optional<Demangled> d = Demangle(name);
    parsed += params.has_value();
    demangled += d.has_value();
    if (!params) ++fallbacks;
    if (!params || !d) continue;
    ++compared;
    const std::string why = Contradiction(*params, pointees, *d);
    if (!why.empty()) {
      if (++contradictions <= 20) {
        ADD_FAILURE() << name << "\n  " << d->text << "\n  " << why;
      }
      continue;
    }
    ++agreed;
    for (size_t i = 0; i < params->size(); ++i) {
      reads += (*params)[i] == ParamAccess::kRead;
      nones += (*params)[i] == ParamAccess::kNone;
      const_tables += pointees[i] == Pointees::kConst;
      reads_missed += (*params)[i] == ParamAccess::kReadWrite && PointerToConst(d->params[i]);
    }
  }
  std::printf(
      "toolkit corpus %s:\n  %zu names, %zu demangled by GNU, %zu parsed "
      "(%zu conservative fallbacks), %zu compared, %zu agreed, %zu "
      "contradicted\n  in the agreeing names: %zu reads, %zu nones and %zu "
      "const tables confirmed; %zu pointers to const left read-write\n",
      g_corpus_path.c_str(), names.size(), demangled, parsed, fallbacks, compared, agreed,
      contradictions, reads, nones, const_tables, reads_missed);
  EXPECT_EQ(contradictions, 0u);
  // The parser understands the toolkit's names: a drop here is a
  // regression (the conservative answer, but a slower one).
  EXPECT_GE(agreed, compared * 99 / 100);
}

// ---- 2. Generated signatures with a known classification ----

// A C++ type as the generator builds it.
struct Type {
  enum class Kind {
    kBuiltin,   // `code` ("f"), printed `name`; void only under a pointer
    kPointer,   // to child 0
    kLRef,      // to child 0
    kRRef,      // to child 0
    kConst,     // child 0, const (never directly over another qualifier)
    kVolatile,  // child 0, volatile (likewise)
    kClass,     // `path`: components with optional template arguments
    kTParam,    // the kernel's template parameter `index`
    kFunction,  // child 0 returns, children 1.. are the parameters
    kArray,     // `index` elements of child 0
  };
  struct Component {
    std::string name;
    bool has_args = false;
    std::vector<int> args;  // types; -1 - n: the integer literal n
  };
  Kind kind = Kind::kBuiltin;
  std::string code;
  bool arithmetic = false;
  std::vector<int> children;
  std::vector<Component> path;
  int index = 0;
};

// Builds random signatures into a pool of types and mangles them.
class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}

  struct Kernel {
    std::string mangled;
    std::vector<ParamAccess> expected;
    std::vector<Pointees> expected_pointees;  // kNone or kConst/kWritable
  };

  Kernel Next() {
    types_.clear();
    targs_.clear();
    subs_.clear();
    Kernel k;
    // The kernel's own name: namespaces, then the function, maybe a template.
    std::vector<Type::Component> name;
    const int namespaces = Pick(3) == 0 ? 0 : Pick(3);
    for (int i = 0; i < namespaces; ++i) name.push_back({Word(kNamespaces)});
    name.push_back({Word(kFunctions)});
    const bool is_template = Pick(2) == 0;
    if (is_template) {
      name.back().has_args = true;
      const int n = 1 + Pick(3);
      // Arguments cannot name the kernel's own parameters: targs_ is set
      // once they are all made.
      std::vector<int> args;
      for (int i = 0; i < n; ++i) args.push_back(RandomType(2, /*top=*/false));
      targs_ = args;
      name.back().args = std::move(args);
      if (Pick(4) == 0) name.back().args.push_back(-1 - Pick(200));
    }
    std::vector<int> params;
    const int n = Pick(6);
    for (int i = 0; i < n; ++i) params.push_back(RandomType(3, /*top=*/true));

    std::string out = "_Z";
    out += MangleName(name, /*is_type=*/false);
    if (is_template) out += "v";  // a function template's return type
    if (params.empty()) out += "v";
    for (int p : params) {
      out += Mangle(p);
      k.expected.push_back(Classify(p));
      k.expected_pointees.push_back(TableOf(p));
    }
    k.mangled = out;
    return k;
  }

 private:
  static constexpr const char* kNamespaces[] = {"ns", "cutlass", "detail", "mlp"};
  static constexpr const char* kFunctions[] = {"kernel", "gemm", "reduce", "scale"};
  static constexpr const char* kClasses[] = {"Params", "Tensor", "__half",
                                             "float4", "Array",  "Holder"};
  struct Builtin {
    const char* code;
    bool arithmetic;
  };
  static constexpr Builtin kBuiltins[] = {
      {"b", true}, {"c", true},  {"a", true},  {"h", true},  {"s", true},  {"t", true},
      {"i", true}, {"j", true},  {"l", true},  {"m", true},  {"x", true},  {"y", true},
      {"n", true}, {"o", true},  {"f", true},  {"d", true},  {"e", true},  {"g", true},
      {"w", true}, {"Ds", true}, {"Di", true}, {"Du", true}, {"Dn", true}, {"Dh", true}};

  int Pick(int n) { return static_cast<int>(rng_() % n); }
  template <size_t N>
  std::string Word(const char* const (&words)[N]) {
    return words[Pick(N)];
  }

  int Add(Type t) {
    types_.push_back(std::move(t));
    return static_cast<int>(types_.size()) - 1;
  }
  int Wrap(Type::Kind kind, int child) {
    Type t;
    t.kind = kind;
    t.children = {child};
    return Add(std::move(t));
  }
  int NewBuiltin(bool allow_void) {
    Type t;
    if (allow_void && Pick(6) == 0) {
      t.code = "v";
    } else {
      const Builtin& b = kBuiltins[Pick(std::size(kBuiltins))];
      t.code = b.code;
      t.arithmetic = b.arithmetic;
    }
    return Add(std::move(t));
  }

  // Whether `t` is (after template parameters are replaced by their
  // arguments) a qualified type, a reference, void, a function or an array:
  // what may not be qualified again or pointed to.
  const Type& Resolved(int t) const {
    while (types_[t].kind == Type::Kind::kTParam) {
      t = targs_[types_[t].index];
    }
    return types_[t];
  }
  bool IsRef(int t) const {
    const Type::Kind k = Resolved(t).kind;
    return k == Type::Kind::kLRef || k == Type::Kind::kRRef;
  }
  bool IsQualified(int t) const {
    const Type::Kind k = Resolved(t).kind;
    return k == Type::Kind::kConst || k == Type::Kind::kVolatile;
  }

  // A random type. `top`: a kernel parameter (no void, array or function;
  // references allowed); otherwise something a pointer, qualifier or
  // template argument may hold.
  int RandomType(int depth, bool top) {
    const int choice = depth <= 0 ? Pick(3) : Pick(12);
    switch (choice) {
      case 0:
      case 1:
        return NewBuiltin(false);
      case 2:
        return NewClass(depth);
      case 3:
      case 4:
      case 5: {  // a pointer, often to const
        int pointee = PointeeType(depth - 1);
        if (Pick(2) == 0 && !IsQualified(pointee) && !IsRef(pointee) &&
            Resolved(pointee).kind != Type::Kind::kFunction &&
            Resolved(pointee).kind != Type::Kind::kArray) {
          pointee = Wrap(Pick(4) == 0 ? Type::Kind::kVolatile : Type::Kind::kConst, pointee);
        }
        return Wrap(Type::Kind::kPointer, pointee);
      }
      case 6:
        if (!targs_.empty()) {
          Type t;
          t.kind = Type::Kind::kTParam;
          t.index = Pick(targs_.size());
          return Add(std::move(t));
        }
        return NewBuiltin(false);
      case 7: {  // a qualified type by value
        const int inner = RandomType(depth - 1, false);
        if (IsQualified(inner) || IsRef(inner) || top) return inner;
        return Wrap(Type::Kind::kConst, inner);
      }
      case 8: {
        const int inner = RandomType(depth - 1, false);
        if (!top || IsRef(inner)) return inner;
        return Wrap(Pick(2) == 0 ? Type::Kind::kLRef : Type::Kind::kRRef, inner);
      }
      case 9: {  // a pointer to a pointer table
        int entry = Wrap(Type::Kind::kPointer, PointeeType(depth - 2));
        if (Pick(2) == 0) entry = Wrap(Type::Kind::kConst, entry);
        return Wrap(Type::Kind::kPointer, entry);
      }
      case 10:
        return NewClass(depth);
      default: {  // pointer to a function, or to an array
        if (Pick(2) == 0) {
          Type f;
          f.kind = Type::Kind::kFunction;
          f.children.push_back(Pick(2) == 0 ? NewBuiltin(true) : RandomType(depth - 2, false));
          const int n = Pick(3);
          for (int i = 0; i < n; ++i) {
            f.children.push_back(RandomType(depth - 2, true));
          }
          return Wrap(Type::Kind::kPointer, Add(std::move(f)));
        }
        Type a;
        a.kind = Type::Kind::kArray;
        a.index = 1 + Pick(64);
        int element = RandomType(depth - 2, false);
        if (IsRef(element) || Resolved(element).kind == Type::Kind::kArray) {
          element = NewBuiltin(false);
        }
        if (Pick(2) == 0 && !IsQualified(element)) {
          element = Wrap(Type::Kind::kConst, element);
        }
        a.children = {element};
        return Wrap(Type::Kind::kPointer, Add(std::move(a)));
      }
    }
  }

  // What a pointer may point to: anything but a reference (void allowed).
  int PointeeType(int depth) {
    if (Pick(8) == 0) return NewBuiltin(true);
    const int t = RandomType(depth, false);
    return IsRef(t) ? NewBuiltin(true) : t;
  }

  int NewClass(int depth) {
    Type t;
    t.kind = Type::Kind::kClass;
    const int namespaces = Pick(3);
    for (int i = 0; i < namespaces; ++i) t.path.push_back({Word(kNamespaces)});
    const int classes = 1 + (Pick(4) == 0);
    for (int i = 0; i < classes; ++i) {
      Type::Component c{Word(kClasses)};
      if (depth > 0 && Pick(2) == 0) {
        c.has_args = true;
        const int n = 1 + Pick(2);
        for (int j = 0; j < n; ++j) {
          if (Pick(4) == 0) {
            c.args.push_back(-1 - Pick(100));
          } else {
            int arg = RandomType(depth - 1, false);
            if (IsRef(arg)) arg = NewBuiltin(false);
            c.args.push_back(arg);
          }
        }
      }
      t.path.push_back(std::move(c));
    }
    return Add(std::move(t));
  }

  // ---- The oracle: what each parameter lets the kernel do ----

  // The qualifiers over `t`, looking through template parameters, and the
  // type under them.
  const Type& Unqualified(int t, bool* is_const) const {
    *is_const = false;
    for (;;) {
      const Type& r = Resolved(t);
      if (r.kind == Type::Kind::kConst) {
        *is_const = true;
      } else if (r.kind != Type::Kind::kVolatile) {
        return r;
      }
      t = r.children[0];
    }
  }

  // A pointer to a const-qualified object is a read; arithmetic builtins
  // are nones; everything else (non-const pointers, references, classes,
  // pointers to functions, and pointers to arrays of const, which the header
  // documents as read-write) may be written.
  ParamAccess Classify(int t) const {
    bool is_const = false;
    const Type& r = Unqualified(t, &is_const);
    if (r.kind == Type::Kind::kBuiltin && r.arithmetic) return ParamAccess::kNone;
    if (r.kind != Type::Kind::kPointer) return ParamAccess::kReadWrite;
    const Type& pointee = Unqualified(r.children[0], &is_const);
    if (is_const && pointee.kind != Type::Kind::kArray && pointee.kind != Type::Kind::kFunction) {
      return ParamAccess::kRead;
    }
    return ParamAccess::kReadWrite;
  }

  // For a pointer (or reference: the address of the object either way) to
  // pointers: whether the entries point to const.
  Pointees TableOf(int t) const {
    bool is_const = false;
    const Type& r = Unqualified(t, &is_const);
    if (r.kind != Type::Kind::kPointer && r.kind != Type::Kind::kLRef &&
        r.kind != Type::Kind::kRRef) {
      return Pointees::kNone;
    }
    const Type& entry = Unqualified(r.children[0], &is_const);
    if (entry.kind != Type::Kind::kPointer) return Pointees::kNone;
    const Type& target = Unqualified(entry.children[0], &is_const);
    return is_const && target.kind != Type::Kind::kArray && target.kind != Type::Kind::kFunction
               ? Pointees::kConst
               : Pointees::kWritable;
  }

  // ---- The mangler: Itanium ABI 5.1, with its substitution table ----

  static std::string Source(const std::string& name) { return absl::StrCat(name.size(), name); }
  static std::string Seq(size_t i) {
    if (i == 0) return "S_";
    std::string digits;
    for (size_t n = i - 1;; n /= 36) {
      const int d = static_cast<int>(n % 36);
      digits.insert(digits.begin(), d < 10 ? '0' + d : 'A' + d - 10);
      if (n < 36) break;
    }
    return "S" + digits + "_";
  }
  // The table holds each candidate's key: its mangling without
  // substitutions, which names one entity (a class and the prefix that
  // names it share a key, as the ABI wants).
  std::optional<std::string> Lookup(const std::string& key) const {
    for (size_t i = 0; i < subs_.size(); ++i) {
      if (subs_[i] == key) return Seq(i);
    }
    return std::nullopt;
  }
  void Candidate(const std::string& key) { subs_.push_back(key); }

  std::string Key(int t) const {
    const Type& x = types_[t];
    switch (x.kind) {
      case Type::Kind::kBuiltin:
        return x.code;
      case Type::Kind::kPointer:
        return "P" + Key(x.children[0]);
      case Type::Kind::kLRef:
        return "R" + Key(x.children[0]);
      case Type::Kind::kRRef:
        return "O" + Key(x.children[0]);
      case Type::Kind::kConst:
        return "K" + Key(x.children[0]);
      case Type::Kind::kVolatile:
        return "V" + Key(x.children[0]);
      case Type::Kind::kClass:
        return PathKey(x.path, x.path.size(), true);
      case Type::Kind::kTParam:
        return TParam(x.index);
      case Type::Kind::kArray:
        return absl::StrCat("A", x.index, "_", Key(x.children[0]));
      case Type::Kind::kFunction: {
        std::string s = "F";
        for (int c : x.children) s += Key(c);
        if (x.children.size() == 1) s += "v";
        return s + "E";
      }
    }
    return "";
  }
  std::string ArgsKey(const Type::Component& c) const {
    std::string s = "I";
    for (int a : c.args) s += a < 0 ? absl::StrCat("Li", -1 - a, "E") : Key(a);
    return s + "E";
  }
  // The first `n` components; `with_args`: the last one's template
  // arguments too (else the template prefix).
  std::string PathKey(const std::vector<Type::Component>& path, size_t n, bool with_args) const {
    std::string s = "Q";
    for (size_t i = 0; i < n; ++i) {
      s += Source(path[i].name);
      if (path[i].has_args && (i + 1 < n || with_args)) s += ArgsKey(path[i]);
    }
    return s;
  }
  static std::string TParam(int index) {
    return index == 0 ? "T_" : absl::StrCat("T", index - 1, "_");
  }

  std::string MangleArgs(const Type::Component& c) {
    std::string s = "I";
    for (int a : c.args) {
      s += a < 0 ? absl::StrCat("Li", -1 - a, "E") : Mangle(a);
    }
    return s + "E";
  }

  // A <name>: unscoped or nested. Candidates are every prefix, each
  // template prefix, and (for a type) the whole name; for the kernel's own
  // name the whole name is not one (a function is not a type), but its
  // template prefix is.
  std::string MangleName(const std::vector<Type::Component>& path, bool is_type) {
    const size_t n = path.size();
    if (is_type) {
      if (auto s = Lookup(PathKey(path, n, true))) return *s;
    }
    // The longest prefix already in the table: (covered components, whether
    // the last covered one still needs its arguments).
    size_t covered = 0;
    bool args_pending = false;
    std::string head;
    for (size_t k = n; k >= 1 && covered == 0; --k) {
      if (path[k - 1].has_args) {
        if (auto s = Lookup(PathKey(path, k, false))) {
          head = *s;
          covered = k;
          args_pending = true;
          break;
        }
      }
      if (k - 1 >= 1) {
        if (auto s = Lookup(PathKey(path, k - 1, true))) {
          head = *s;
          covered = k - 1;
          break;
        }
      }
    }
    std::string out = head;
    if (args_pending) {
      out += MangleArgs(path[covered - 1]);
      if (covered < n || is_type) Candidate(PathKey(path, covered, true));
    }
    for (size_t k = covered + 1; k <= n; ++k) {
      out += Source(path[k - 1].name);
      const bool last = k == n;
      if (path[k - 1].has_args) {
        Candidate(PathKey(path, k, false));
        out += MangleArgs(path[k - 1]);
      }
      if (!last || is_type) Candidate(PathKey(path, k, true));
    }
    if (n == 1 && !args_pending && covered == 0) return out;  // unscoped
    if (n == 1 && args_pending) return out;                   // S_ I...E
    return "N" + out + "E";
  }

  std::string Mangle(int t) {
    const Type& x = types_[t];
    if (x.kind == Type::Kind::kBuiltin) return x.code;
    if (x.kind == Type::Kind::kClass) return MangleName(x.path, true);
    const std::string key = Key(t);
    if (auto s = Lookup(key)) return *s;
    std::string out;
    switch (x.kind) {
      case Type::Kind::kPointer:
        out = "P" + Mangle(x.children[0]);
        break;
      case Type::Kind::kLRef:
        out = "R" + Mangle(x.children[0]);
        break;
      case Type::Kind::kRRef:
        out = "O" + Mangle(x.children[0]);
        break;
      case Type::Kind::kConst:
        out = "K" + Mangle(x.children[0]);
        break;
      case Type::Kind::kVolatile:
        out = "V" + Mangle(x.children[0]);
        break;
      case Type::Kind::kTParam:
        out = TParam(x.index);
        break;
      case Type::Kind::kArray:
        out = absl::StrCat("A", x.index, "_", Mangle(x.children[0]));
        break;
      case Type::Kind::kFunction:
        out = "F";
        for (int c : x.children) out += Mangle(c);
        if (x.children.size() == 1) out += "v";
        out += "E";
        break;
      default:
        break;
    }
    Candidate(key);
    return out;
  }

  std::mt19937_64 rng_;
  std::vector<Type> types_;
  std::vector<int> targs_;  // the kernel's template arguments
  std::vector<std::string> subs_;
};

std::string Letters(const std::vector<ParamAccess>& params) {
  std::string s;
  for (ParamAccess a : params) {
    s += a == ParamAccess::kNone ? 'n' : a == ParamAccess::kRead ? 'r' : 'w';
  }
  return s;
}

TEST(KernelSignatureDifferentialTest, GeneratedSignatures) {
  constexpr int kNames = 30000;
  Generator generator(20261201);
  size_t parsed = 0, exact = 0, demangled = 0, gnu_agreed = 0;
  size_t reads = 0, nones = 0, const_tables = 0, failures = 0;
  size_t const_tables_missed = 0;
  for (int i = 0; i < kNames; ++i) {
    const Generator::Kernel k = generator.Next();
    const std::string expected = Letters(k.expected);
    std::vector<Pointees> pointees;
    const std::optional<std::vector<ParamAccess>> params =
        ClassifyMangledParams(k.mangled, &pointees);
    const std::optional<Demangled> d = Demangle(k.mangled);
    // The generator against GNU: it mangled what it meant.
    if (!d) {
      if (++failures <= 20) ADD_FAILURE() << "GNU cannot demangle " << k.mangled;
      continue;
    }
    ++demangled;
    const std::string gnu =
        Contradiction(k.expected, std::vector<Pointees>(k.expected.size(), Pointees::kNone), *d);
    if (!gnu.empty()) {
      if (++failures <= 20) {
        ADD_FAILURE() << "generator and GNU disagree on " << k.mangled << "\n  " << d->text
                      << "\n  expected " << expected << ": " << gnu;
      }
      continue;
    }
    ++gnu_agreed;
    if (!params) continue;  // the conservative answer: counted, not wrong
    ++parsed;
    // A const-table claim must be right; any other Pointees answer is the
    // conservative one (the caller counts the targets as written).
    bool tables_safe = true;
    for (size_t j = 0; j < pointees.size() && j < k.expected_pointees.size(); ++j) {
      if (pointees[j] == Pointees::kConst && k.expected_pointees[j] != Pointees::kConst) {
        tables_safe = false;
      }
      const_tables_missed +=
          k.expected_pointees[j] == Pointees::kConst && pointees[j] != Pointees::kConst;
    }
    if (Letters(*params) != expected || !tables_safe) {
      if (++failures <= 20) {
        ADD_FAILURE() << k.mangled << "\n  " << d->text << "\n  expected " << expected
                      << ", parsed " << Letters(*params)
                      << (tables_safe ? "" : ", a const table claimed wrongly");
      }
      continue;
    }
    ++exact;
    for (size_t j = 0; j < params->size(); ++j) {
      reads += (*params)[j] == ParamAccess::kRead;
      nones += (*params)[j] == ParamAccess::kNone;
      const_tables += pointees[j] == Pointees::kConst;
    }
  }
  std::printf(
      "generated: %d names, %zu demangled by GNU, %zu as the generator meant "
      "them; %zu parsed, %zu exactly as expected (%zu reads, %zu nones, %zu "
      "const tables, %zu const tables left writable); %zu failures\n",
      kNames, demangled, gnu_agreed, parsed, exact, reads, nones, const_tables, const_tables_missed,
      failures);
  EXPECT_EQ(failures, 0u);
  EXPECT_EQ(parsed, static_cast<size_t>(kNames));
}

}  // namespace
}  // namespace stensor

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc > 1) stensor::g_corpus_path = argv[1];
  return RUN_ALL_TESTS();
}
