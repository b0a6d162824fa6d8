#include "core/inference/kernel_signature.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <utility>

namespace stensor {
namespace kernel_signature_internal {
namespace {

// Bounds that keep hostile input cheap. Real kernel names nest templates a
// few dozen levels at most and are a few KiB long (the longest of 22,000
// names in the CUDA 13 libraries has 2,490 characters); anything past these
// limits is answered conservatively (parsed == false). At the recursion
// bound the parser uses about 32 KiB of stack.
constexpr int kMaxRecursion = 160;
constexpr size_t kMaxNameLength = size_t{1} << 16;
constexpr int kMaxResolveHops = 64;
constexpr uint32_t kMaxNumber = uint32_t{1} << 24;
constexpr int kFail = -1;
// libstdc++'s __cxa_demangle keeps its parse tree on the stack, about 100
// bytes per character of the name; longer names (which it mostly rejects
// anyway) skip the cross-check so a launch on a small thread stack is safe.
constexpr size_t kMaxDemangleLength = 2048;

// Bit i of Node::tparams says a subtree mentions the kernel's template
// parameter i; the top bit stands for every index from 63 on. Pack
// expansions (`Dp`) need it to find the packs they expand.
constexpr int kOverflowBit = 63;
constexpr uint64_t TemplateParamBit(uint32_t index) {
  return uint64_t{1} << (index < kOverflowBit ? index : kOverflowBit);
}

// Qualifiers of a kQualified node.
constexpr uint8_t kConst = 1;
constexpr uint8_t kVolatile = 2;
constexpr uint8_t kRestrict = 4;
constexpr uint8_t kVendorQualifier = 8;

// What the classifier needs to know about a parsed component. Everything that
// cannot make a pointer-to-const parameter (class names, arrays, functions,
// member pointers, vector types, ...) is kOpaque, which classifies as a
// read-write; the parser still walks it in full because the substitution
// candidates it defines shift the meaning of every later `S<n>_`.
enum class Kind : uint8_t {
  kScalar,         // arithmetic builtin, nullptr_t
  kVoid,           // `v`
  kEllipsis,       // `z`
  kPointer,        // `P` child
  kReference,      // `R` / `O` child
  kQualified,      // child with `quals`
  kTemplateParam,  // `T<n>_`
  kPackExpansion,  // `Dp` child
  kArgList,        // template arguments or an argument pack
  kOpaque,         // names, classes, arrays, functions, ...
  kNonType,        // literal or expression template argument
};

struct Node {
  Kind kind = Kind::kOpaque;
  uint8_t quals = 0;
  int32_t child = kFail;
  // kTemplateParam: the parameter number. kArgList: first entry in lists_.
  uint32_t index = 0;
  // kArgList: number of entries.
  uint32_t count = 0;
  uint64_t tparams = 0;
};

// What a parsed <name> says about the function it names.
struct NameInfo {
  // The template arguments of the last component, or kFail: a function
  // template encodes its return type before the parameters.
  int template_args = kFail;
  // Constructors, destructors and conversion operators have no return type
  // even when they are templates.
  bool ctor_dtor_or_conversion = false;
  // Closure and unnamed types carry their own number and never take a
  // discriminator in a local name.
  bool closure_or_unnamed = false;
};

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsUpper(char c) { return c >= 'A' && c <= 'Z'; }
bool IsLower(char c) { return c >= 'a' && c <= 'z'; }

// Operator codes of the Itanium ABI with the operand count they take in an
// expression; kSpecial marks the ones whose operands are not plain
// expressions and are parsed by hand.
constexpr int kSpecial = -1;
struct OperatorCode {
  char code[3];
  int arity;
};
constexpr OperatorCode kOperators[] = {
    {"aN", 2},        {"aS", 2},        {"aa", 2},        {"ad", 1},        {"an", 2},
    {"at", kSpecial}, {"aw", 1},        {"az", 1},        {"cc", kSpecial}, {"cl", kSpecial},
    {"cm", 2},        {"co", 1},        {"cv", kSpecial}, {"dV", 2},        {"dX", kSpecial},
    {"da", 1},        {"dc", kSpecial}, {"de", 1},        {"di", kSpecial}, {"dl", 1},
    {"ds", 2},        {"dt", kSpecial}, {"dv", 2},        {"dx", kSpecial}, {"eO", 2},
    {"eo", 2},        {"eq", 2},        {"fL", kSpecial}, {"fR", kSpecial}, {"fl", kSpecial},
    {"fr", kSpecial}, {"ge", 2},        {"gs", 1},        {"gt", 2},        {"ix", 2},
    {"lS", 2},        {"le", 2},        {"li", kSpecial}, {"ls", 2},        {"lt", 2},
    {"mI", 2},        {"mL", 2},        {"mi", 2},        {"ml", 2},        {"mm", kSpecial},
    {"na", kSpecial}, {"ne", 2},        {"ng", 1},        {"nt", 1},        {"nw", kSpecial},
    {"nx", 1},        {"oR", 2},        {"oo", 2},        {"or", 2},        {"pL", 2},
    {"pl", 2},        {"pm", 2},        {"pp", kSpecial}, {"ps", 1},        {"pt", kSpecial},
    {"qu", 3},        {"rM", 2},        {"rS", 2},        {"rc", kSpecial}, {"rm", 2},
    {"rs", 2},        {"sP", kSpecial}, {"sZ", kSpecial}, {"sc", kSpecial}, {"ss", 2},
    {"st", kSpecial}, {"sz", 1},        {"te", 1},        {"ti", kSpecial}, {"tr", 0},
    {"tw", 1},
};

const OperatorCode* FindOperator(char a, char b) {
  for (const OperatorCode& op : kOperators) {
    if (op.code[0] == a && op.code[1] == b) return &op;
  }
  return nullptr;
}

// A recursive-descent parser for `_Z <encoding>` that keeps exactly the
// substitution table the ABI defines (section 5.1.10, "Compression"), so
// `S<n>_` resolves to the same component the compiler meant and keeps its
// qualifiers: in _ZN3mlp14linear_forwardEPKfS1_S1_Pfiii the table is
// {mlp, const float, const float*}, so both S1_ are reads. Where the ABI and
// libiberty differ (libiberty adds unnamed types `Ut_` twice), the parser
// follows the ABI, as g++ and nvcc do.
//
// Every parse function returns a node index or kFail; a failure anywhere
// fails the whole parse.
class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) { nodes_.reserve(text.size() / 4 + 8); }

  std::optional<std::vector<ParamAccess>> Run();
  // With `pointees`, Run also fills one Pointees entry per parameter.
  void set_pointees_out(std::vector<Pointees>* pointees) { pointees_ = pointees; }

 private:
  // Bounds the recursion of the mutually recursive parse functions; every
  // cycle among them passes through at least one function that holds one.
  class DepthGuard {
   public:
    explicit DepthGuard(int* depth) : depth_(depth) { ++*depth_; }
    ~DepthGuard() { --*depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
    bool ok() const { return *depth_ <= kMaxRecursion; }

   private:
    int* depth_;
  };

  char Peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  bool Consume(char c) {
    if (AtEnd() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }

  int NewNode(Kind kind, int child = kFail, uint64_t tparams = 0) {
    Node node;
    node.kind = kind;
    node.child = child;
    node.tparams = tparams;
    nodes_.push_back(node);
    return static_cast<int>(nodes_.size()) - 1;
  }
  int Opaque(uint64_t tparams) { return NewNode(Kind::kOpaque, kFail, tparams); }
  uint64_t Mask(int node) const { return node < 0 ? 0 : nodes_[node].tparams; }
  void AddSubstitution(int node) { subs_.push_back(node); }

  bool ParseNumber(uint32_t* out);
  bool ParseCompactNumber();
  bool SkipDigits();
  bool ParseDiscriminator();
  int ParseSourceName();
  int ParseEncoding();
  int ParseName(bool substitutable, NameInfo* info);
  int ParseNestedName(NameInfo* info);
  int ParseLocalName(NameInfo* info);
  int ParseUnqualifiedName(int scope, NameInfo* info);
  int ParseOperatorName(NameInfo* info);
  int ParseClosureType();
  int ParseSubstitution();
  int ParseTemplateParam();
  int ParseTemplateArgs();
  int ParseTemplateArgsUntilEnd(uint64_t* mask);
  int ParseTemplateArg();
  int ParseType();
  int ParseQualifiedType();
  int ParseFunctionType();
  int ParseArrayType();
  int ParseVectorType();
  int ParseExpression();
  int ParseExprPrimary();
  int ParseExpressionList(char terminator, uint64_t* mask);
  int ParseFunctionParam();
  int ParseUnresolvedName();
  int ParseBaseUnresolvedName();
  int ParseSimpleId();

  int KernelTemplateArg(uint32_t index) const;
  int Resolve(int node, int element) const;
  int PointeeIsConst(int node, int element) const;
  std::optional<ParamAccess> Classify(int node, int element) const;
  Pointees ClassifyPointees(int node, int element) const;
  bool AppendParam(int node, std::vector<ParamAccess>* out) const;

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
  // 1 while parsing the kernel's own encoding, more inside nested ones
  // (`L_Z...E` template arguments, local names).
  int encoding_depth_ = 0;
  std::vector<Node> nodes_;
  std::vector<int> lists_;
  std::vector<int> subs_;
  int kernel_template_args_ = kFail;
  std::vector<int> kernel_params_;
  std::vector<Pointees>* pointees_ = nullptr;
};

std::optional<std::vector<ParamAccess>> Parser::Run() {
  if (text_.size() > kMaxNameLength) return std::nullopt;
  if (!Consume('_') || !Consume('Z')) return std::nullopt;
  if (ParseEncoding() < 0) return std::nullopt;
  // Clone suffixes (".constprop.0", ".isra.0") do not change the signature.
  if (Peek() == '.') {
    for (; !AtEnd(); ++pos_) {
      const char c = text_[pos_];
      if (!(IsDigit(c) || IsLower(c) || IsUpper(c) || c == '_' || c == '.')) {
        return std::nullopt;
      }
    }
  }
  if (!AtEnd()) return std::nullopt;

  std::vector<ParamAccess> out;
  // A lone `v` is the empty parameter list.
  if (kernel_params_.size() == 1 && nodes_[kernel_params_[0]].kind == Kind::kVoid) {
    return out;
  }
  out.reserve(kernel_params_.size());
  for (int param : kernel_params_) {
    if (!AppendParam(param, &out)) return std::nullopt;
  }
  return out;
}

bool Parser::ParseNumber(uint32_t* out) {
  if (!IsDigit(Peek())) return false;
  uint32_t value = 0;
  while (IsDigit(Peek())) {
    value = value * 10 + static_cast<uint32_t>(text_[pos_] - '0');
    if (value > kMaxNumber) return false;
    ++pos_;
  }
  *out = value;
  return true;
}

// `_` or `<number> _` (parameter and lambda numbers, discriminators).
bool Parser::ParseCompactNumber() {
  if (Consume('_')) return true;
  uint32_t unused;
  return ParseNumber(&unused) && Consume('_');
}

// Array bounds and literal-free numbers whose value does not matter and may
// exceed kMaxNumber.
bool Parser::SkipDigits() {
  if (!IsDigit(Peek())) return false;
  while (IsDigit(Peek())) ++pos_;
  return true;
}

// `_ <digit>` or `__ <number> _`.
bool Parser::ParseDiscriminator() {
  if (!Consume('_')) return true;
  const bool long_form = Consume('_');
  uint32_t value = 0;
  if (!ParseNumber(&value)) return false;
  if (long_form && value >= 10) return Consume('_');
  return true;
}

int Parser::ParseSourceName() {
  uint32_t length = 0;
  if (!ParseNumber(&length) || length == 0) return kFail;
  if (length > text_.size() - pos_) return kFail;
  pos_ += length;
  return Opaque(0);
}

// <encoding> ::= <name> <bare-function-type> | <name> (data)
int Parser::ParseEncoding() {
  DepthGuard guard(&depth_);
  if (!guard.ok()) return kFail;
  // Special names (vtables, thunks, guard variables) are never kernels.
  if (Peek() == 'T' || Peek() == 'G') return kFail;
  ++encoding_depth_;
  struct Restore {
    int* depth;
    ~Restore() { --*depth; }
  } restore{&encoding_depth_};
  const bool is_kernel = encoding_depth_ == 1;

  NameInfo info;
  const int name = ParseName(/*substitutable=*/false, &info);
  if (name < 0) return kFail;
  if (is_kernel) kernel_template_args_ = info.template_args;

  const char c = Peek();
  if (c == '\0' || c == 'E' || c == '.') {
    // A data name, valid inside `L_Z...E`, never as a kernel.
    return is_kernel ? kFail : name;
  }
  // Function templates encode the return type first (ABI 5.1.5.3).
  bool has_return_type = info.template_args >= 0 && !info.ctor_dtor_or_conversion;
  if (Consume('J')) has_return_type = true;
  if (has_return_type && ParseType() < 0) return kFail;

  size_t count = 0;
  for (;;) {
    const char p = Peek();
    if (p == '\0' || p == 'E' || p == '.') break;
    if ((p == 'R' || p == 'O') && Peek(1) == 'E') break;
    const int type = ParseType();
    if (type < 0) return kFail;
    if (is_kernel) kernel_params_.push_back(type);
    ++count;
  }
  if (count == 0) return kFail;
  return name;
}

// <name> ::= <nested-name> | <local-name> | <unscoped-name>
//          | <unscoped-template-name> <template-args>
int Parser::ParseName(bool substitutable, NameInfo* info) {
  DepthGuard guard(&depth_);
  if (!guard.ok()) return kFail;
  int name = kFail;
  switch (Peek()) {
    case 'N':
      name = ParseNestedName(info);
      break;
    case 'Z':
      name = ParseLocalName(info);
      break;
    case 'U':
      name = ParseUnqualifiedName(kFail, info);
      break;
    default: {
      bool from_substitution = false;
      if (Peek() == 'S') {
        if (Peek(1) == 't') {
          pos_ += 2;  // `St`: ::std::, part of the unqualified name below
        } else {
          name = ParseSubstitution();
          if (name < 0) return kFail;
          from_substitution = true;
          info->template_args = kFail;
          info->ctor_dtor_or_conversion = false;
          info->closure_or_unnamed = false;
        }
      }
      if (!from_substitution) name = ParseUnqualifiedName(kFail, info);
      if (name < 0) return kFail;
      if (Peek() == 'I') {
        // An <unscoped-template-name> is a candidate unless it came from
        // the table already.
        if (!from_substitution) AddSubstitution(name);
        const int args = ParseTemplateArgs();
        if (args < 0) return kFail;
        name = Opaque(Mask(name) | Mask(args));
        info->template_args = args;
        from_substitution = false;
      }
      if (substitutable && !from_substitution) AddSubstitution(name);
      return name;
    }
  }
  if (name < 0) return kFail;
  if (substitutable) AddSubstitution(name);
  return name;
}

// <nested-name> ::= N [<CV-qualifiers>] [<ref-qualifier>] <prefix>
//                   <unqualified-name> E
//                 | N [<CV-qualifiers>] [<ref-qualifier>] <template-prefix>
//                   <template-args> E
// Every prefix is a candidate; the complete name is not (the caller adds it
// when it names a type).
int Parser::ParseNestedName(NameInfo* info) {
  if (!Consume('N')) return kFail;
  // Qualifiers of `this`: they do not change the parameters.
  Consume('r');
  Consume('V');
  Consume('K');
  if (Peek() == 'R' || Peek() == 'O') ++pos_;

  info->template_args = kFail;
  info->ctor_dtor_or_conversion = false;
  info->closure_or_unnamed = false;
  int prefix = kFail;
  for (;;) {
    const char c = Peek();
    if (c == 'D' && (Peek(1) == 'T' || Peek(1) == 't')) {
      if (prefix >= 0) return kFail;
      prefix = ParseType();  // decltype, a candidate of its own
      info->template_args = kFail;
    } else if (c == 'I') {
      if (prefix < 0) return kFail;
      const int args = ParseTemplateArgs();
      if (args < 0) return kFail;
      prefix = Opaque(Mask(prefix) | Mask(args));
      info->template_args = args;
    } else if (c == 'T') {
      if (prefix >= 0) return kFail;
      prefix = ParseTemplateParam();
      info->template_args = kFail;
    } else if (c == 'M') {
      // Lambda in a data member initializer: the member is already a
      // candidate.
      ++pos_;
      continue;
    } else if (c == 'S') {
      if (prefix >= 0) return kFail;
      prefix = ParseSubstitution();
      if (prefix < 0) return kFail;
      continue;  // already in the table
    } else {
      prefix = ParseUnqualifiedName(prefix, info);
    }
    if (prefix < 0) return kFail;
    if (Peek() == 'E') break;
    AddSubstitution(prefix);
  }
  if (!Consume('E')) return kFail;
  return prefix;
}

// <local-name> ::= Z <encoding> E <name> [<discriminator>]
//                | Z <encoding> E s [<discriminator>]
//                | Z <encoding> E d [<number>] _ <name>
int Parser::ParseLocalName(NameInfo* info) {
  if (!Consume('Z')) return kFail;
  const int function = ParseEncoding();
  if (function < 0 || !Consume('E')) return kFail;
  if (Consume('s')) {
    *info = NameInfo();
    if (!ParseDiscriminator()) return kFail;
    return Opaque(0);
  }
  if (Consume('d') && !ParseCompactNumber()) return kFail;
  const int entity = ParseName(/*substitutable=*/false, info);
  if (entity < 0) return kFail;
  if (!info->closure_or_unnamed && !ParseDiscriminator()) return kFail;
  return Opaque(Mask(function) | Mask(entity));
}

// <unqualified-name> ::= <operator-name> | <ctor-dtor-name> | <source-name>
//                      | <unnamed-type-name> | L <source-name>
//                      followed by any <abi-tags>.
int Parser::ParseUnqualifiedName(int scope, NameInfo* info) {
  info->template_args = kFail;
  info->ctor_dtor_or_conversion = false;
  info->closure_or_unnamed = false;
  const char c = Peek();
  int part = kFail;
  if (IsDigit(c)) {
    part = ParseSourceName();
  } else if (IsLower(c)) {
    part = ParseOperatorName(info);
  } else if (c == 'C') {
    ++pos_;
    const bool inheriting = Consume('I');
    if (Peek() < '1' || Peek() > '5') return kFail;
    ++pos_;
    part = inheriting ? ParseType() : Opaque(0);
    info->ctor_dtor_or_conversion = true;
  } else if (c == 'D') {
    const char kind = Peek(1);
    if (kind != '0' && kind != '1' && kind != '2' && kind != '4' && kind != '5') {
      return kFail;  // also DC, structured bindings
    }
    pos_ += 2;
    part = Opaque(0);
    info->ctor_dtor_or_conversion = true;
  } else if (c == 'L') {
    ++pos_;
    part = ParseSourceName();
    if (part >= 0 && !ParseDiscriminator()) return kFail;
  } else if (c == 'U') {
    part = ParseClosureType();
    info->closure_or_unnamed = true;
  } else {
    return kFail;  // includes module names (W) and friends (F)
  }
  if (part < 0) return kFail;
  while (Consume('B')) {
    if (ParseSourceName() < 0) return kFail;
  }
  return Opaque(Mask(scope) | Mask(part));
}

// <operator-name>, with the `on` prefix that expressions put before one.
int Parser::ParseOperatorName(NameInfo* info) {
  if (Peek() == 'o' && Peek(1) == 'n') pos_ += 2;
  const char a = Peek();
  const char b = Peek(1);
  if (a == 'v' && IsDigit(b)) {  // vendor extended operator
    pos_ += 2;
    return ParseSourceName();
  }
  if (FindOperator(a, b) == nullptr) return kFail;
  pos_ += 2;
  if (a == 'c' && b == 'v') {  // conversion operator: cv <type>
    info->ctor_dtor_or_conversion = true;
    return ParseType();
  }
  if (a == 'l' && b == 'i') return ParseSourceName();  // literal operator
  return Opaque(0);
}

// <closure-type-name> ::= Ul <lambda-sig> E [<number>] _
// <unnamed-type-name> ::= Ut [<number>] _
// Neither is a candidate by itself (libiberty adds `Ut_`, g++ does not).
int Parser::ParseClosureType() {
  if (!Consume('U')) return kFail;
  if (Consume('t')) return ParseCompactNumber() ? Opaque(0) : kFail;
  if (!Consume('l')) return kFail;
  // Generic lambdas with explicit template heads (Ty, Tn, Tt, Tp) are rare
  // in kernel names; the parser does not model their parameter scopes.
  if (Peek() == 'T' && !IsDigit(Peek(1)) && Peek(1) != '_') return kFail;
  uint64_t mask = 0;
  size_t count = 0;
  while (!Consume('E')) {
    if (AtEnd()) return kFail;
    const int type = ParseType();
    if (type < 0) return kFail;
    mask |= Mask(type);
    ++count;
  }
  if (count == 0 || !ParseCompactNumber()) return kFail;
  return Opaque(mask);
}

// <substitution> ::= S_ | S <seq-id> _ | St | Sa | Sb | Ss | Si | So | Sd
int Parser::ParseSubstitution() {
  if (!Consume('S')) return kFail;
  const char c = Peek();
  uint32_t id = 0;
  if (Consume('_')) {
    id = 0;
  } else if (IsDigit(c) || IsUpper(c)) {
    uint32_t seq = 0;
    while (!Consume('_')) {
      const char d = Peek();
      uint32_t digit;
      if (IsDigit(d)) {
        digit = static_cast<uint32_t>(d - '0');
      } else if (IsUpper(d)) {
        digit = static_cast<uint32_t>(d - 'A') + 10;
      } else {
        return kFail;
      }
      seq = seq * 36 + digit;
      if (seq > kMaxNumber) return kFail;
      ++pos_;
    }
    id = seq + 1;
  } else if (c == 't' || c == 'a' || c == 'b' || c == 's' || c == 'i' || c == 'o' || c == 'd') {
    ++pos_;
    const int node = Opaque(0);
    if (Peek() == 'B') {
      // A standard abbreviation with ABI tags becomes a candidate.
      while (Consume('B')) {
        if (ParseSourceName() < 0) return kFail;
      }
      AddSubstitution(node);
    }
    return node;
  } else {
    return kFail;
  }
  if (id >= subs_.size()) return kFail;
  return subs_[id];
}

// <template-param> ::= T_ | T <number> _
int Parser::ParseTemplateParam() {
  if (!Consume('T')) return kFail;
  uint32_t index = 0;
  if (!Consume('_')) {
    if (!ParseNumber(&index) || !Consume('_')) return kFail;
    ++index;
  }
  // Only parameters met in the kernel's own encoding count towards the
  // packs a `Dp` expands; one inside a nested encoding (a lambda's enclosing
  // function, `L_Z...E`) belongs to that template.
  const bool kernel_scope = encoding_depth_ == 1;
  const int node = NewNode(Kind::kTemplateParam, kFail, kernel_scope ? TemplateParamBit(index) : 0);
  nodes_[node].index = index;
  return node;
}

// <template-args> ::= I <template-arg>* E ; an argument pack is J ... E.
int Parser::ParseTemplateArgs() {
  DepthGuard guard(&depth_);
  if (!guard.ok()) return kFail;
  if (!Consume('I') && !Consume('J')) return kFail;
  uint64_t mask = 0;
  return ParseTemplateArgsUntilEnd(&mask);
}

int Parser::ParseTemplateArgsUntilEnd(uint64_t* mask) {
  std::vector<int> args;
  while (!Consume('E')) {
    if (AtEnd()) return kFail;
    const int arg = ParseTemplateArg();
    if (arg < 0) return kFail;
    args.push_back(arg);
    *mask |= Mask(arg);
  }
  const int node = NewNode(Kind::kArgList, kFail, *mask);
  nodes_[node].index = static_cast<uint32_t>(lists_.size());
  nodes_[node].count = static_cast<uint32_t>(args.size());
  lists_.insert(lists_.end(), args.begin(), args.end());
  return node;
}

// <template-arg> ::= <type> | X <expression> E | <expr-primary>
//                  | J <template-arg>* E
int Parser::ParseTemplateArg() {
  switch (Peek()) {
    case 'X': {
      ++pos_;
      const int expr = ParseExpression();
      if (expr < 0 || !Consume('E')) return kFail;
      return NewNode(Kind::kNonType, kFail, Mask(expr));
    }
    case 'L':
      return ParseExprPrimary();
    case 'I':
    case 'J':
      return ParseTemplateArgs();
    default:
      return ParseType();
  }
}

int Parser::ParseType() {
  DepthGuard guard(&depth_);
  if (!guard.ok()) return kFail;
  const char c = Peek();
  if (c == 'r' || c == 'V' || c == 'K' ||
      (c == 'D' && (Peek(1) == 'x' || Peek(1) == 'o' || Peek(1) == 'O' || Peek(1) == 'w'))) {
    return ParseQualifiedType();
  }
  int node = kFail;
  switch (c) {
    // clang-format off
    case 'a': case 'b': case 'c': case 'd': case 'e': case 'f': case 'g':
    case 'h': case 'i': case 'j': case 'l': case 'm': case 'n': case 'o':
    case 's': case 't': case 'w': case 'x': case 'y':
      // clang-format on
      ++pos_;
      return NewNode(Kind::kScalar);  // builtins are never candidates
    case 'v':
      ++pos_;
      return NewNode(Kind::kVoid);
    case 'z':
      ++pos_;
      return NewNode(Kind::kEllipsis);
    case 'u':  // vendor extended type: a value of unknown content
      ++pos_;
      if (ParseSourceName() < 0) return kFail;
      node = Opaque(0);
      break;
    case 'F':
      node = ParseFunctionType();
      break;
    case 'A':
      node = ParseArrayType();
      break;
    case 'M': {  // pointer to member: M <class type> <member type>
      ++pos_;
      const int cls = ParseType();
      if (cls < 0) return kFail;
      const int member = ParseType();
      if (member < 0) return kFail;
      node = Opaque(Mask(cls) | Mask(member));
      break;
    }
    case 'T': {
      node = ParseTemplateParam();
      if (node < 0) return kFail;
      if (Peek() == 'I') {
        // <template-template-param> <template-args>: both are candidates.
        AddSubstitution(node);
        const int args = ParseTemplateArgs();
        if (args < 0) return kFail;
        node = Opaque(Mask(node) | Mask(args));
      }
      break;
    }
    case 'P':
    case 'R':
    case 'O': {
      ++pos_;
      const int inner = ParseType();
      if (inner < 0) return kFail;
      node = NewNode(c == 'P' ? Kind::kPointer : Kind::kReference, inner, Mask(inner));
      break;
    }
    case 'C':    // complex
    case 'G': {  // imaginary
      ++pos_;
      const int inner = ParseType();
      if (inner < 0) return kFail;
      node = Opaque(Mask(inner));
      break;
    }
    case 'U': {  // vendor qualifier: U <source-name> [<template-args>] <type>
      ++pos_;
      if (ParseSourceName() < 0) return kFail;
      uint64_t mask = 0;
      if (Peek() == 'I') {
        const int args = ParseTemplateArgs();
        if (args < 0) return kFail;
        mask |= Mask(args);
      }
      const int inner = ParseType();
      if (inner < 0) return kFail;
      node = NewNode(Kind::kQualified, inner, mask | Mask(inner));
      nodes_[node].quals = kVendorQualifier;
      break;
    }
    case 'D': {
      const char d = Peek(1);
      if (d == 'T' || d == 't') {  // decltype(expression)
        pos_ += 2;
        const int expr = ParseExpression();
        if (expr < 0 || !Consume('E')) return kFail;
        node = Opaque(Mask(expr));
      } else if (d == 'p') {  // pack expansion
        pos_ += 2;
        const int pattern = ParseType();
        if (pattern < 0) return kFail;
        node = NewNode(Kind::kPackExpansion, pattern, Mask(pattern));
      } else if (d == 'a' || d == 'c') {  // auto, decltype(auto)
        pos_ += 2;
        return Opaque(0);
      } else if (d == 'f' || d == 'd' || d == 'e' || d == 'h' || d == 'u' || d == 's' || d == 'i' ||
                 d == 'n') {
        // decimal floats, half, char8_t/16_t/32_t, nullptr_t
        pos_ += 2;
        return NewNode(Kind::kScalar);
      } else if (d == 'F') {  // DF<bits>_, DF<bits>x, DF16b
        pos_ += 2;
        uint32_t bits = 0;
        if (!ParseNumber(&bits)) return kFail;
        if (!Consume('_') && !Consume('x') && !(bits == 16 && Consume('b'))) {
          return kFail;
        }
        return NewNode(Kind::kScalar);
      } else if (d == 'v') {
        node = ParseVectorType();
      } else {
        return kFail;  // _BitInt and anything newer: not understood
      }
      break;
    }
    default:
      // <class-enum-type> ::= <name>
      if (IsDigit(c) || c == 'N' || c == 'Z' || c == 'S') {
        NameInfo info;
        return ParseName(/*substitutable=*/true, &info);
      }
      return kFail;
  }
  if (node < 0) return kFail;
  AddSubstitution(node);
  return node;
}

// <CV-qualifiers> <type>. The fully qualified type is one candidate; a
// subset of the qualifiers is not (`PVKf` adds `volatile const float`, never
// `const float`).
int Parser::ParseQualifiedType() {
  uint8_t quals = 0;
  bool function_qualifiers = false;
  for (;;) {
    const char c = Peek();
    if (c == 'r') {
      quals |= kRestrict;
      ++pos_;
    } else if (c == 'V') {
      quals |= kVolatile;
      ++pos_;
    } else if (c == 'K') {
      quals |= kConst;
      ++pos_;
    } else if (c == 'D' && (Peek(1) == 'x' || Peek(1) == 'o')) {
      pos_ += 2;  // transaction_safe, noexcept
      function_qualifiers = true;
    } else if (c == 'D' && Peek(1) == 'O') {  // noexcept(expression)
      pos_ += 2;
      if (ParseExpression() < 0 || !Consume('E')) return kFail;
      function_qualifiers = true;
    } else if (c == 'D' && Peek(1) == 'w') {  // throw(types)
      pos_ += 2;
      while (!Consume('E')) {
        if (AtEnd() || ParseType() < 0) return kFail;
      }
      function_qualifiers = true;
    } else {
      break;
    }
  }
  int node = kFail;
  if (Peek() == 'F') {
    // Qualifiers of a function type apply to `this`; the unqualified
    // function type is not a candidate.
    const int function = ParseFunctionType();
    if (function < 0) return kFail;
    node = Opaque(Mask(function));
  } else {
    if (function_qualifiers) return kFail;
    const int inner = ParseType();
    if (inner < 0) return kFail;
    node = NewNode(Kind::kQualified, inner, Mask(inner));
    nodes_[node].quals = quals;
  }
  AddSubstitution(node);
  return node;
}

// <function-type> ::= F [Y] <return type> <parameter types>+ [<ref-qualifier>]
// E
int Parser::ParseFunctionType() {
  if (!Consume('F')) return kFail;
  Consume('Y');
  Consume('J');
  uint64_t mask = 0;
  const int ret = ParseType();
  if (ret < 0) return kFail;
  mask |= Mask(ret);
  size_t count = 0;
  for (;;) {
    const char c = Peek();
    if (c == 'E') break;
    if ((c == 'R' || c == 'O') && Peek(1) == 'E') {
      ++pos_;
      break;
    }
    if (AtEnd()) return kFail;
    const int type = ParseType();
    if (type < 0) return kFail;
    mask |= Mask(type);
    ++count;
  }
  if (count == 0 || !Consume('E')) return kFail;
  return Opaque(mask);
}

// <array-type> ::= A <number> _ <type> | A [<expression>] _ <type>
int Parser::ParseArrayType() {
  if (!Consume('A')) return kFail;
  uint64_t mask = 0;
  if (IsDigit(Peek())) {
    SkipDigits();
  } else if (Peek() != '_') {
    const int expr = ParseExpression();
    if (expr < 0) return kFail;
    mask |= Mask(expr);
  }
  if (!Consume('_')) return kFail;
  const int element = ParseType();
  if (element < 0) return kFail;
  return Opaque(mask | Mask(element));
}

// <vector-type> ::= Dv <number> _ <type> | Dv _ <expression> _ <type>
int Parser::ParseVectorType() {
  pos_ += 2;  // Dv
  uint64_t mask = 0;
  if (Consume('_')) {
    const int expr = ParseExpression();
    if (expr < 0) return kFail;
    mask |= Mask(expr);
  } else if (!SkipDigits()) {
    return kFail;
  }
  if (!Consume('_')) return kFail;
  const int element = ParseType();
  if (element < 0) return kFail;
  return Opaque(mask | Mask(element));
}

// <expr-primary> ::= L <type> <value> E | L _Z <encoding> E
int Parser::ParseExprPrimary() {
  if (!Consume('L')) return kFail;
  if (Peek() == '_' || Peek() == 'Z') {
    Consume('_');
    if (!Consume('Z')) return kFail;
    const int entity = ParseEncoding();
    if (entity < 0 || !Consume('E')) return kFail;
    return NewNode(Kind::kNonType);
  }
  // The type is parsed as any type and so adds its candidates (enum
  // literals: `L4Mode1E` makes Mode a candidate).
  const int type = ParseType();
  if (type < 0) return kFail;
  // The value (decimal, `n`-negative, hex float) runs to the `E`.
  while (!Consume('E')) {
    if (AtEnd()) return kFail;
    ++pos_;
  }
  return NewNode(Kind::kNonType, kFail, Mask(type));
}

// <expression>* followed by `terminator`.
int Parser::ParseExpressionList(char terminator, uint64_t* mask) {
  while (!Consume(terminator)) {
    if (AtEnd()) return kFail;
    const int expr = ParseExpression();
    if (expr < 0) return kFail;
    *mask |= Mask(expr);
  }
  return 0;
}

// <function-param> ::= fp [<CV>] [<number>] _ | fL <number> p [<CV>] [<number>]
// _
//                    | fpT
int Parser::ParseFunctionParam() {
  if (Peek() != 'f') return kFail;
  if (Peek(1) == 'L') {
    pos_ += 2;
    if (!SkipDigits() || !Consume('p')) return kFail;
  } else if (Peek(1) == 'p') {
    pos_ += 2;
    if (Consume('T')) return NewNode(Kind::kNonType);
  } else {
    return kFail;
  }
  Consume('r');
  Consume('V');
  Consume('K');
  if (!ParseCompactNumber()) return kFail;
  return NewNode(Kind::kNonType);
}

// <simple-id> ::= <source-name> [<template-args>]
int Parser::ParseSimpleId() {
  int name = ParseSourceName();
  if (name < 0) return kFail;
  if (Peek() == 'I') {
    const int args = ParseTemplateArgs();
    if (args < 0) return kFail;
    name = Opaque(Mask(args));
  }
  return name;
}

// <base-unresolved-name> ::= <simple-id> | on <operator-name> [<template-args>]
//                          | dn <destructor-name>
int Parser::ParseBaseUnresolvedName() {
  if (Peek() == 'd' && Peek(1) == 'n') {
    pos_ += 2;
    return IsDigit(Peek()) ? ParseSimpleId() : ParseType();
  }
  if (IsDigit(Peek())) return ParseSimpleId();
  NameInfo unused;
  int name = ParseOperatorName(&unused);
  if (name < 0) return kFail;
  if (Peek() == 'I') {
    const int args = ParseTemplateArgs();
    if (args < 0) return kFail;
    name = Opaque(Mask(name) | Mask(args));
  }
  return name;
}

// <unresolved-name> after `sr`:
//   sr <unresolved-qualifier-level>+ E <base-unresolved-name>
//   sr <unresolved-type> <base-unresolved-name>
// `srN` (a qualified dependent type) is not modelled.
int Parser::ParseUnresolvedName() {
  pos_ += 2;  // sr
  uint64_t mask = 0;
  if (IsDigit(Peek())) {
    while (!Consume('E')) {
      const int level = ParseSimpleId();
      if (level < 0) return kFail;
      mask |= Mask(level);
    }
  } else if (Peek() == 'N') {
    return kFail;
  } else {
    const int type = ParseType();
    if (type < 0) return kFail;
    mask |= Mask(type);
  }
  const int base = ParseBaseUnresolvedName();
  if (base < 0) return kFail;
  return NewNode(Kind::kNonType, kFail, mask | Mask(base));
}

// <expression>: only its extent and the template parameters it mentions
// matter here, but every type inside is parsed as a type so the candidates
// it adds are counted.
int Parser::ParseExpression() {
  DepthGuard guard(&depth_);
  if (!guard.ok()) return kFail;
  const char a = Peek();
  const char b = Peek(1);
  uint64_t mask = 0;
  if (a == 'L') return ParseExprPrimary();
  if (a == 'T') return ParseTemplateParam();  // not a candidate here
  if (a == 's' && b == 'r') return ParseUnresolvedName();
  if (a == 's' && b == 'p') {  // pack expansion
    pos_ += 2;
    return ParseExpression();
  }
  if (a == 'f' && (b == 'p' || (b == 'L' && IsDigit(Peek(2))))) {
    return ParseFunctionParam();
  }
  if (IsDigit(a) || (a == 'o' && b == 'n')) {
    // An unresolved name used as an expression: f(t), operator+(t).
    const int name = IsDigit(a) ? ParseSimpleId() : ParseBaseUnresolvedName();
    if (name < 0) return kFail;
    return NewNode(Kind::kNonType, kFail, Mask(name));
  }
  if ((a == 'i' || a == 't') && b == 'l') {  // braced initializer list
    pos_ += 2;
    if (a == 't') {
      const int type = ParseType();
      if (type < 0) return kFail;
      mask |= Mask(type);
    }
    if (ParseExpressionList('E', &mask) < 0) return kFail;
    return NewNode(Kind::kNonType, kFail, mask);
  }
  if (a == 'u') {  // vendor extended expression
    ++pos_;
    if (ParseSourceName() < 0) return kFail;
    if (ParseTemplateArgsUntilEnd(&mask) < 0) return kFail;
    return NewNode(Kind::kNonType, kFail, mask);
  }
  if (a == 'v' && IsDigit(b)) {  // vendor operator with `b` operands
    pos_ += 2;
    if (ParseSourceName() < 0) return kFail;
    for (int i = 0; i < b - '0'; ++i) {
      const int operand = ParseExpression();
      if (operand < 0) return kFail;
      mask |= Mask(operand);
    }
    return NewNode(Kind::kNonType, kFail, mask);
  }

  const OperatorCode* op = FindOperator(a, b);
  if (op == nullptr) return kFail;
  pos_ += 2;
  auto expr = [&]() {
    const int e = ParseExpression();
    mask |= Mask(e);
    return e >= 0;
  };
  auto type = [&]() {
    const int t = ParseType();
    mask |= Mask(t);
    return t >= 0;
  };
  bool ok = true;
  if (op->arity >= 0) {
    for (int i = 0; ok && i < op->arity; ++i) ok = expr();
  } else if (a == 'c' && b == 'v') {
    // cv <type> <expression> | cv <type> _ <expression>* E
    ok = type() && (Consume('_') ? ParseExpressionList('E', &mask) >= 0 : expr());
  } else if (b == 'c') {  // dc sc cc rc <type> <expression>
    ok = type() && expr();
  } else if (a == 'c' && b == 'l') {  // cl <expression>+ E
    ok = expr() && ParseExpressionList('E', &mask) >= 0;
  } else if (b == 't' && (a == 'd' || a == 'p')) {  // dt pt <expr> <name>
    ok = expr();
    if (ok) {
      if ((Peek() == 'g' && Peek(1) == 's') || (Peek() == 's' && Peek(1) == 'r')) {
        ok = expr();
      } else {
        const int name = ParseBaseUnresolvedName();
        mask |= Mask(name);
        ok = name >= 0;
      }
    }
  } else if ((a == 's' || a == 'a') && b == 't') {  // sizeof/alignof type
    ok = type();
  } else if (a == 't' && b == 'i') {  // typeid(type)
    ok = type();
  } else if (a == 's' && b == 'Z') {  // sizeof...(pack)
    ok = expr();
  } else if (a == 's' && b == 'P') {  // sizeof...(args)
    ok = ParseTemplateArgsUntilEnd(&mask) >= 0;
  } else if (a == 'f') {  // folds: fl/fr <op> <expr>, fL/fR <op> <expr> <expr>
    const char o1 = Peek();
    const char o2 = Peek(1);
    ok = FindOperator(o1, o2) != nullptr;
    if (ok) {
      pos_ += 2;
      ok = expr() && (b == 'l' || b == 'r' || expr());
    }
  } else if (a == 'd' && b == 'i') {  // .name = expr
    ok = ParseSourceName() >= 0 && expr();
  } else if (a == 'd' && b == 'x') {  // [expr] = expr
    ok = expr() && expr();
  } else if (a == 'd' && b == 'X') {  // [expr ... expr] = expr
    ok = expr() && expr() && expr();
  } else if ((a == 'p' && b == 'p') || (a == 'm' && b == 'm')) {
    Consume('_');  // prefix form
    ok = expr();
  } else if (a == 'n' && (b == 'w' || b == 'a')) {
    // new: <expression>* _ <type> E | ... pi <expression>* E | ... il ... E
    ok = ParseExpressionList('_', &mask) >= 0 && type();
    if (ok) {
      if (Consume('E')) {
        // no initializer
      } else if (Peek() == 'p' && Peek(1) == 'i') {
        pos_ += 2;
        ok = ParseExpressionList('E', &mask) >= 0;
      } else if (Peek() == 'i' && Peek(1) == 'l') {
        ok = expr();
      } else {
        ok = false;
      }
    }
  } else {
    ok = false;  // li and the like are names, not expressions
  }
  if (!ok) return kFail;
  return NewNode(Kind::kNonType, kFail, mask);
}

int Parser::KernelTemplateArg(uint32_t index) const {
  if (kernel_template_args_ < 0) return kFail;
  const Node& args = nodes_[kernel_template_args_];
  if (index >= args.count) return kFail;
  return lists_[args.index + index];
}

// Follows kernel template parameters to their arguments; `element` picks
// the entry of an argument pack while expanding a `Dp` parameter.
int Parser::Resolve(int node, int element) const {
  for (int hops = 0; hops < kMaxResolveHops; ++hops) {
    if (node < 0) return kFail;
    const Node& n = nodes_[node];
    if (n.kind != Kind::kTemplateParam) return node;
    // A template parameter names "parameter #i of the template in scope",
    // so one that a parameter reaches through a substitution means the
    // kernel's own parameter even when the candidate was recorded inside a
    // nested encoding: in _Z13gen_sequencedI15curandStateTestdiXadL_Z...
    // IS0_EdPT_iEEEvS3_..., S3_ is the `T_*` of the nested function and
    // stands for the kernel's `curandStateTest*`. g++ and the demanglers
    // agree on this reading.
    int arg = KernelTemplateArg(n.index);
    if (arg < 0) return kFail;
    if (nodes_[arg].kind == Kind::kArgList) {
      const Node& pack = nodes_[arg];
      if (element < 0 || static_cast<uint32_t>(element) >= pack.count) {
        return kFail;
      }
      arg = lists_[pack.index + static_cast<uint32_t>(element)];
    }
    node = arg;
  }
  return kFail;
}

// 1 when the pointee carries `const` (possibly with other qualifiers, on a
// template argument or on the pointer's own pattern), 0 when not, kFail when
// it cannot be resolved.
int Parser::PointeeIsConst(int node, int element) const {
  for (int hops = 0; hops < kMaxResolveHops; ++hops) {
    node = Resolve(node, element);
    if (node < 0) return kFail;
    const Node& n = nodes_[node];
    if (n.kind != Kind::kQualified) return 0;
    if (n.quals & kConst) return 1;
    node = n.child;
  }
  return kFail;
}

std::optional<ParamAccess> Parser::Classify(int node, int element) const {
  for (int hops = 0; hops < kMaxResolveHops; ++hops) {
    node = Resolve(node, element);
    if (node < 0) return std::nullopt;
    const Node& n = nodes_[node];
    switch (n.kind) {
      case Kind::kScalar:
        return ParamAccess::kNone;
      case Kind::kQualified:
        node = n.child;  // top-level qualifiers do not matter
        continue;
      case Kind::kPointer: {
        const int is_const = PointeeIsConst(n.child, element);
        if (is_const < 0) return std::nullopt;
        return is_const ? ParamAccess::kRead : ParamAccess::kReadWrite;
      }
      case Kind::kReference:
      case Kind::kOpaque:
        return ParamAccess::kReadWrite;
      default:
        // void among other parameters, `...`, an unexpanded pack, an
        // unresolvable template parameter: not a signature we understand.
        return std::nullopt;
    }
  }
  return std::nullopt;
}

// Whether a parameter points to pointers (`T**`, `T* const*`, `T*&`) and
// whether those pointers' targets are const. Anything not understood counts
// as pointers to writable memory.
//
// A reference is a level of indirection like a pointer: the word passed for
// `float const**&` is the address of a `float const**`, so the buffer it
// hits is a table whose entry points to `float const*` objects, which the
// kernel may write (kWritable). Stripping the reference, as this did once,
// answered kConst for it: a missed write the differential test found.
// References to references collapse (`Args&&...` with `X const&` is
// `X const&`), so they are one level.
Pointees Parser::ClassifyPointees(int node, int element) const {
  // Strips qualifiers down to the first pointer (or reference).
  auto pointer_below = [&](int n, bool references) -> int {
    for (int hops = 0; hops < kMaxResolveHops; ++hops) {
      n = Resolve(n, element);
      if (n < 0) return kFail;
      const Node& nd = nodes_[n];
      if (nd.kind == Kind::kQualified) {
        n = nd.child;
        continue;
      }
      if (nd.kind == Kind::kPointer) return n;
      return references && nd.kind == Kind::kReference ? n : kFail;
    }
    return kFail;
  };
  int outer = pointer_below(node, true);
  if (outer < 0) return Pointees::kNone;
  for (int hops = 0; nodes_[outer].kind == Kind::kReference; ++hops) {
    const int referenced = Resolve(nodes_[outer].child, element);
    if (referenced < 0 || hops >= kMaxResolveHops) return Pointees::kWritable;
    if (nodes_[referenced].kind != Kind::kReference) break;
    outer = referenced;
  }
  const int inner = pointer_below(nodes_[outer].child, false);
  if (inner < 0) return Pointees::kNone;
  return PointeeIsConst(nodes_[inner].child, element) == 1 ? Pointees::kConst : Pointees::kWritable;
}

// Appends the classification of one parameter, or of every parameter a pack
// expansion stands for (`Args... args` is a single `DpT_` in the name).
bool Parser::AppendParam(int node, std::vector<ParamAccess>* out) const {
  if (nodes_[node].kind != Kind::kPackExpansion) {
    const std::optional<ParamAccess> access = Classify(node, -1);
    if (!access) return false;
    out->push_back(*access);
    if (pointees_ != nullptr) pointees_->push_back(ClassifyPointees(node, -1));
    return true;
  }
  const int pattern = nodes_[node].child;
  const uint64_t mask = nodes_[pattern].tparams;
  if (mask & TemplateParamBit(kOverflowBit)) return false;
  int length = -1;
  for (uint32_t i = 0; i < kOverflowBit; ++i) {
    if (!(mask & TemplateParamBit(i))) continue;
    const int arg = KernelTemplateArg(i);
    if (arg < 0) return false;
    if (nodes_[arg].kind != Kind::kArgList) continue;
    const int count = static_cast<int>(nodes_[arg].count);
    if (length >= 0 && length != count) return false;
    length = count;
  }
  if (length < 0) return false;  // expands no pack
  for (int element = 0; element < length; ++element) {
    const std::optional<ParamAccess> access = Classify(pattern, element);
    if (!access) return false;
    out->push_back(*access);
    if (pointees_ != nullptr) pointees_->push_back(ClassifyPointees(pattern, element));
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

bool EndsWithWord(std::string_view s, std::string_view word) {
  if (s.size() < word.size() + 1) return false;
  return s.substr(s.size() - word.size()) == word && s[s.size() - word.size() - 1] == ' ';
}

// True when the demangler printed a pointer to const: "float const*",
// "float* const*", "float const volatile*".
bool PrintedAsPointerToConst(std::string_view type) {
  type = Trim(type);
  if (type.empty() || type.back() != '*') return false;
  type = Trim(type.substr(0, type.size() - 1));
  bool is_const = false;
  for (;;) {
    if (EndsWithWord(type, "const")) {
      is_const = true;
      type = Trim(type.substr(0, type.size() - 5));
    } else if (EndsWithWord(type, "volatile")) {
      type = Trim(type.substr(0, type.size() - 8));
    } else if (EndsWithWord(type, "restrict")) {
      type = Trim(type.substr(0, type.size() - 8));
    } else {
      return is_const;
    }
  }
}

// Splits the parameter list of a demangled function name into the printed
// parameter types. False when the text does not end in a parameter list
// whose brackets balance.
bool SplitDemangledParams(std::string_view text, std::vector<std::string_view>* params) {
  // "f(float*) [clone .constprop.0]"
  while (!text.empty() && text.back() == ']') {
    const size_t clone = text.rfind(" [clone ");
    if (clone == std::string_view::npos) return false;
    text = text.substr(0, clone);
  }
  // Qualifiers of member functions: "S::f() const &".
  for (;;) {
    text = Trim(text);
    if (EndsWithWord(text, "const")) {
      text.remove_suffix(5);
    } else if (EndsWithWord(text, "volatile") || EndsWithWord(text, "restrict")) {
      text.remove_suffix(8);
    } else if (EndsWithWord(text, "&&")) {
      text.remove_suffix(2);
    } else if (EndsWithWord(text, "&")) {
      text.remove_suffix(1);
    } else {
      break;
    }
  }
  if (text.empty() || text.back() != ')') return false;
  int depth = 0;
  size_t open = std::string_view::npos;
  for (size_t i = text.size(); i-- > 0;) {
    if (text[i] == ')') ++depth;
    if (text[i] == '(' && --depth == 0) {
      open = i;
      break;
    }
  }
  if (open == std::string_view::npos) return false;
  const std::string_view list = text.substr(open + 1, text.size() - open - 2);
  if (Trim(list).empty()) return true;

  // Commas separate parameters only outside (), [], {} and <>. A '>' with
  // no open '<' is part of an operator name ("operator->") and is skipped;
  // a closing bracket drops any '<' it encloses ("(a<b)").
  std::vector<char> open_brackets;
  size_t start = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    switch (c) {
      case '(':
      case '[':
      case '{':
      case '<':
        open_brackets.push_back(c);
        break;
      case ')':
      case ']':
      case '}': {
        const char match = c == ')' ? '(' : c == ']' ? '[' : '{';
        while (!open_brackets.empty() && open_brackets.back() == '<') {
          open_brackets.pop_back();
        }
        if (open_brackets.empty() || open_brackets.back() != match) {
          return false;
        }
        open_brackets.pop_back();
        break;
      }
      case '>':
        if (!open_brackets.empty() && open_brackets.back() == '<') {
          open_brackets.pop_back();
        }
        break;
      case ',':
        if (open_brackets.empty()) {
          params->push_back(list.substr(start, i - start));
          start = i + 1;
        }
        break;
      default:
        break;
    }
  }
  if (!open_brackets.empty()) return false;
  params->push_back(list.substr(start));
  return true;
}

}  // namespace

std::optional<std::vector<ParamAccess>> ClassifyMangledParams(std::string_view mangled) {
  return Parser(mangled).Run();
}

std::optional<std::vector<ParamAccess>> ClassifyMangledParams(std::string_view mangled,
                                                              std::vector<Pointees>* pointees) {
  Parser parser(mangled);
  parser.set_pointees_out(pointees);
  return parser.Run();
}

bool PrintedAsPointerToPointerToConst(std::string_view type) {
  type = Trim(type);
  // A reference to the table's pointer is a level like a pointer
  // ("float const* const&"; ClassifyPointees).
  if (type.empty() || (type.back() != '*' && type.back() != '&')) return false;
  type.remove_suffix(1);
  if (!type.empty() && type.back() == '&') type.remove_suffix(1);
  type = Trim(type);
  for (;;) {  // the qualifiers of the table's entries do not matter
    if (EndsWithWord(type, "const")) {
      type = Trim(type.substr(0, type.size() - 5));
    } else if (EndsWithWord(type, "volatile") || EndsWithWord(type, "restrict")) {
      type = Trim(type.substr(0, type.size() - 8));
    } else {
      break;
    }
  }
  return PrintedAsPointerToConst(type);
}

bool DemangledParamsAgree(std::string_view demangled, const std::vector<ParamAccess>& params) {
  std::vector<std::string_view> printed;
  if (!SplitDemangledParams(demangled, &printed)) return false;
  if (printed.size() != params.size()) return false;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string_view type = Trim(printed[i]);
    switch (params[i]) {
      case ParamAccess::kRead:
        if (!PrintedAsPointerToConst(type)) return false;
        break;
      case ParamAccess::kNone:
        if (type.empty() || type.find_first_of("*&") != std::string_view::npos) {
          return false;
        }
        break;
      case ParamAccess::kReadWrite:
        break;  // the conservative answer needs no confirmation
    }
  }
  return true;
}

}  // namespace kernel_signature_internal

const char* ParamAccessName(ParamAccess access) {
  switch (access) {
    case ParamAccess::kNone:
      return "none";
    case ParamAccess::kRead:
      return "read";
    case ParamAccess::kReadWrite:
      return "read-write";
  }
  return "read-write";
}

ParamAccess KernelSignature::For(size_t index) const {
  if (!parsed || index >= params.size()) return ParamAccess::kReadWrite;
  return params[index];
}

Pointees KernelSignature::PointeesFor(size_t index) const {
  if (!parsed || index >= pointees.size()) return Pointees::kNone;
  return pointees[index];
}

KernelSignature ParseKernelSignature(std::string_view mangled) {
  KernelSignature signature;
  signature.demangled_name = std::string(mangled);
  // Only `_Z` names are mangled functions; __cxa_demangle would also turn
  // an extern "C" kernel called "f" into "float". Embedded NULs cannot be
  // handed to it.
  if (mangled.size() < 2 || mangled.substr(0, 2) != "_Z" ||
      mangled.find('\0') != std::string_view::npos) {
    return signature;
  }
  std::vector<Pointees> pointees;
  std::optional<std::vector<ParamAccess>> params =
      kernel_signature_internal::ClassifyMangledParams(mangled, &pointees);
  // The demangler only sees names the parser accepted: libstdc++'s (GCC 12)
  // runs for minutes or more on some short malformed names, such as
  // _Z1hKfcgnstfssssssAsssssssssrssssssssrestrKffDn (found by
  // core/inference/kernel_signature_fuzz.cc), and a launch must not hang on a name.
  // A name the parser rejects keeps its mangled spelling in logs.
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(nullptr, &std::free);
  if (params && mangled.size() <= kernel_signature_internal::kMaxDemangleLength) {
    demangled.reset(
        abi::__cxa_demangle(signature.demangled_name.c_str(), nullptr, nullptr, &status));
  }
  if (demangled != nullptr && status == 0) {
    signature.demangled_name = demangled.get();
    if (params &&
        !kernel_signature_internal::DemangledParamsAgree(signature.demangled_name, *params)) {
      return signature;
    }
    // A const-pointee claim is a read claim too: the printed type must
    // confirm it, else the targets count as written.
    std::vector<std::string_view> printed;
    if (params &&
        kernel_signature_internal::SplitDemangledParams(signature.demangled_name, &printed) &&
        printed.size() == pointees.size()) {
      for (size_t i = 0; i < pointees.size(); ++i) {
        if (pointees[i] == Pointees::kConst &&
            !kernel_signature_internal::PrintedAsPointerToPointerToConst(printed[i])) {
          pointees[i] = Pointees::kWritable;
        }
      }
    }
  }
  // Without a demangled name there is nothing to cross-check against: the
  // libstdc++ demangler gives up on names that need more components than
  // its fixed budget of twice the name's length (large CUTLASS kernels such
  // as cutlass::Kernel<...>(Op::Params)) and is not asked about very long
  // ones, while the structural parse still understands them. The parse
  // alone is then the answer; it agrees with LLVM's demangler on every
  // such name in the test corpus.
  if (!params) return signature;
  signature.parsed = true;
  signature.params = std::move(*params);
  signature.pointees = std::move(pointees);
  return signature;
}

}  // namespace stensor
