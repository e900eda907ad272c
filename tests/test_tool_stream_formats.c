/* tests/test_tool_stream_formats.c - the reply parser (server/tool_stream.c) on the formats the
 * whole-text parser it replaced never read: GLM-4.5 and Qwen3-Coder (server/tool_glm.c), DeepSeek
 * V3.1 / R1, Kimi-K2 and Command R7B. Hand-worked replies and what their parse must give, then every
 * prefix a prefix of the whole parse and a stream's deltas adding up to it (format_prefixes).
 * Part of test_tool_stream (its main calls these). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "test_tool_stream.h"
#include "tool_format.h"

/* A reply in format f and what its whole parse must give (the first call's name and arguments
 * when name is set, the content, the number of calls); then every prefix a prefix of the whole
 * parse and a stream's deltas adding up to it (format_prefixes), with and without max_calls 1. */
struct call_case {
    const char *text, *name, *args, *content;
    int calls;
};

/* max_calls 1 keeps the first of a reply's calls (named first). */
static void first_call_only(enum tool_format f, const char *label, const char *text, const char *first)
{
    struct tool_parsed p;
    CHECK(!tool_parse(f, 1, 0, 0, 1, text, strlen(text), 1, &p), "oom");
    CHECK(p.n_calls == 1 && !strcmp(p.calls[0].name, first), "%s max_calls 1: %d calls", label, p.n_calls);
    tool_parsed_free(&p);
}

static void check_call_cases(enum tool_format f, const char *label, const struct call_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct tool_parsed p;
        CHECK(!tool_parse(f, 1, 0, 0, 0, cases[i].text, strlen(cases[i].text), 1, &p), "oom");
        int ok = p.n_calls == cases[i].calls && !strcmp(p.content, cases[i].content) &&
                 (!cases[i].name || (!strcmp(p.calls[0].name, cases[i].name) && !strcmp(p.calls[0].args, cases[i].args) &&
                                     p.calls[0].complete));
        if (!ok) {
            fprintf(stderr, "FAIL %s call '%s': %d calls (%s %s), content '%s'\n", label, cases[i].text, p.n_calls,
                    p.n_calls ? p.calls[0].name : "", p.n_calls ? p.calls[0].args : "", p.content);
            exit(1);
        }
        tool_parsed_free(&p);
        format_prefixes(f, 1, 0, cases[i].text, strlen(cases[i].text));
        format_prefixes(f, 1, 1, cases[i].text, strlen(cases[i].text));
    }
}

/* GLM-4.5's calls (tool_glm.c): the bodies GLM-4.6's template writes (a string value as it is,
 * others as JSON), parsed into JSON arguments; malformed or cut-short bodies are text; every prefix
 * a prefix of the whole parse and a stream's deltas adding up to it (format_prefixes). */
void check_glm(void)
{
    static const struct call_case cases[] = {
        {"<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>", "get_weather",
         "{\"city\":\"Paris\"}", "", 1},
        {"Let me check.\n<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>42</arg_value>\n<arg_key>o</arg_key>\n"
         "<arg_value>{\"a\": [1, true]}</arg_value>\n</tool_call>", "f", "{\"n\":42,\"o\":{\"a\": [1, true]}}",
         "Let me check.", 1},
        {"<tool_call>f\n<arg_key>s</arg_key>\n<arg_value>say \"hi\"\n\tthen</arg_value>\n</tool_call>", "f",
         "{\"s\":\"say \\\"hi\\\"\\u000a\\u0009then\"}", "", 1},
        {"<tool_call>noargs</tool_call>", "noargs", "{}", "", 1},
        {"<tool_call>a\n<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>\n<tool_call>b\n</tool_call> done", "a",
         "{\"x\":1}", "done", 2},
        {"<tool_call>f\n<arg_key>x</arg_key>\n</tool_call> tail", NULL, NULL,
         "<tool_call>f\n<arg_key>x</arg_key>\n</tool_call> tail", 0},
        {"<tool_call>f\n<arg_key>x</arg_key>\n<arg_value>1", NULL, NULL, "<tool_call>f\n<arg_key>x</arg_key>\n<arg_value>1", 0},
        {"<tool_call>\n</tool_call>", NULL, NULL, "<tool_call>\n</tool_call>", 0},
        {"<tool_call>f\n<arg_key>x</arg_key>\n<arg_value>-1.5e3</arg_value>\n<arg_key>y</arg_key>\n<arg_value>01</arg_value>"
         "\n</tool_call>", "f", "{\"x\":-1.5e3,\"y\":\"01\"}", "", 1},
        {"plain text, no call", NULL, NULL, "plain text, no call", 0},
    };
    check_call_cases(TOOL_FORMAT_GLM, "glm", cases, sizeof cases / sizeof *cases);
}

/* DeepSeek's calls (tool_stream.c read_deepseek, tool_glm.c tool_deepseek_call): V3.1's and R1's
 * bodies as their templates write them (llama.cpp models/templates: deepseek-ai-DeepSeek-V3.1.jinja,
 * deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja), several calls, the list's end missing at the end
 * of the reply; malformed or cut-short lists are text; every prefix a prefix of the whole parse. */
#define DS_CALLS "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"
void check_deepseek(void)
{
    static const struct call_case cases[] = {
        {DS_CALLS DS_CALL "get_weather" DS_SEP "{\"city\": \"Paris\"}" DS_CALL_END DS_CALLS_END, "get_weather",
         "{\"city\": \"Paris\"}", "", 1},
        {"Let me look.\n\n" DS_CALLS DS_CALL "function" DS_SEP "search\n```json\n{\"q\": \"x\"}\n```" DS_CALL_END DS_CALLS_END,
         "search", "{\"q\": \"x\"}", "Let me look.", 1},
        {DS_CALLS DS_CALL "a" DS_SEP "{}" DS_CALL_END "\n" DS_CALL "b" DS_SEP "{\"n\": [1, 2]}" DS_CALL_END DS_CALLS_END " done",
         "a", "{}", "done", 2},
        {DS_CALLS DS_CALL "f" DS_SEP "{\"x\": 1}" DS_CALL_END, "f", "{\"x\": 1}", "", 1},
        {DS_CALLS DS_CALL "f" DS_SEP "not json" DS_CALL_END DS_CALLS_END " tail", NULL, NULL,
         DS_CALLS DS_CALL "f" DS_SEP "not json" DS_CALL_END DS_CALLS_END " tail", 0},
        {DS_CALLS DS_CALL "f" DS_SEP "{\"x\": 1", NULL, NULL, DS_CALLS DS_CALL "f" DS_SEP "{\"x\": 1", 0},
        {DS_CALLS DS_CALL "two words" DS_SEP "{}" DS_CALL_END, NULL, NULL, DS_CALLS DS_CALL "two words" DS_SEP "{}" DS_CALL_END, 0},
        {DS_CALLS "junk", NULL, NULL, DS_CALLS "junk", 0},
        {"plain text, no call", NULL, NULL, "plain text, no call", 0},
    };
    check_call_cases(TOOL_FORMAT_DEEPSEEK, "deepseek", cases, sizeof cases / sizeof *cases);
    /* max_calls 1 keeps the first of two; the detection by the template's text. */
    first_call_only(TOOL_FORMAT_DEEPSEEK, "deepseek", cases[2].text, "a");
    CHECK(tool_format_detect("{% if tools %}{{'" DS_CALLS "'}}{% endif %}") == TOOL_FORMAT_DEEPSEEK,
          "the DeepSeek template's marker detected");
    fprintf(stderr, "PASS deepseek: %zu replies (V3.1 and R1 bodies), every prefix\n", sizeof cases / sizeof *cases);
}

/* Kimi-K2's list: DeepSeek's shape with its markers, bodies `functions.NAME:INDEX<|tool_call_argument_begin|>ARGS`. */
void check_kimi(void)
{
#define K_CALLS "<|tool_calls_section_begin|>"
#define K_CALL "<|tool_call_begin|>"
#define K_ARGS "<|tool_call_argument_begin|>"
#define K_END "<|tool_call_end|>"
#define K_CALLS_END "<|tool_calls_section_end|>"
    static const struct call_case cases[] = {
        {K_CALLS K_CALL "functions.get_weather:0" K_ARGS "{\"city\": \"Paris\"}" K_END K_CALLS_END, "get_weather",
         "{\"city\": \"Paris\"}", "", 1},
        {"Let me look." K_CALLS K_CALL "functions.search:3" K_ARGS "{\"q\": \"x\"}" K_END K_CALLS_END, "search",
         "{\"q\": \"x\"}", "Let me look.", 1},
        {K_CALLS K_CALL "functions.a:0" K_ARGS "{}" K_END K_CALL "functions.b:1" K_ARGS "{\"n\": [1, 2]}" K_END K_CALLS_END " done",
         "a", "{}", "done", 2},
        {K_CALLS K_CALL "plain_name" K_ARGS "{\"x\": 1}" K_END, "plain_name", "{\"x\": 1}", "", 1},
        {K_CALLS K_CALL "functions.f:0" K_ARGS "not json" K_END K_CALLS_END " tail", NULL, NULL,
         K_CALLS K_CALL "functions.f:0" K_ARGS "not json" K_END K_CALLS_END " tail", 0},
        {K_CALLS K_CALL "functions.f:0" K_ARGS "{\"x\": 1", NULL, NULL, K_CALLS K_CALL "functions.f:0" K_ARGS "{\"x\": 1", 0},
        {K_CALLS K_CALL "functions.:0" K_ARGS "{}" K_END, NULL, NULL, K_CALLS K_CALL "functions.:0" K_ARGS "{}" K_END, 0},
        {K_CALLS "junk", NULL, NULL, K_CALLS "junk", 0},
    };
    check_call_cases(TOOL_FORMAT_KIMI, "kimi", cases, sizeof cases / sizeof *cases);
    CHECK(tool_format_detect("{% if tools %}{{'" K_CALLS "'}}{% endif %}") == TOOL_FORMAT_KIMI,
          "the Kimi-K2 template's marker detected");
    fprintf(stderr, "PASS kimi: %zu replies, every prefix\n", sizeof cases / sizeof *cases);
#undef K_CALLS
#undef K_CALL
#undef K_ARGS
#undef K_END
#undef K_CALLS_END
}

/* Command R7B's list between <|START_ACTION|> and <|END_ACTION|> ({"tool_call_id", "tool_name",
 * "parameters"}: the id not kept), its answer's <|START_RESPONSE|> ... <|END_RESPONSE|> dropped from
 * the content; malformed lists are text. */
void check_command_r7b(void)
{
#define R_ACT "<|START_ACTION|>"
#define R_ACT_END "<|END_ACTION|>"
#define R_RESP "<|START_RESPONSE|>"
#define R_RESP_END "<|END_RESPONSE|>"
    static const struct call_case cases[] = {
        {R_ACT "[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n]" R_ACT_END,
         "get_weather", "{\"city\": \"Paris\"}", "", 1},
        {R_ACT "[{\"tool_call_id\":\"0\",\"tool_name\":\"a\",\"parameters\":{}},{\"tool_call_id\":\"1\",\"tool_name\":\"b\","
         "\"parameters\":{\"n\":[1,2]}}]" R_ACT_END, "a", "{}", "", 2},
        {R_RESP "The weather is fine." R_RESP_END, NULL, NULL, "The weather is fine.", 0},
        {"Let me check." R_ACT "[{\"tool_name\": \"f\", \"parameters\": {\"q\": 1}}]", "f", "{\"q\": 1}", "Let me check.", 1},
        {R_ACT "[{\"tool_call_id\": \"0\", \"tool_name\": \"f\", \"parameters\": {}}]" R_ACT_END " " R_RESP "Done." R_RESP_END,
         "f", "{}", "Done.", 1},
        {R_ACT "[{\"tool_call_id\": \"0\", \"parameters\": {}}]" R_ACT_END, NULL, NULL,
         R_ACT "[{\"tool_call_id\": \"0\", \"parameters\": {}}]" R_ACT_END, 0},
        {R_ACT "[{\"tool_name\": \"f\", \"parameters\": {\"x\": 1", NULL, NULL, "", 1}, /* cut short: a partial call, as MISTRAL's */
        {R_RESP "a <|START_ACT b" R_RESP_END, NULL, NULL, "a <|START_ACT b", 0},
        {R_ACT "[{\"tool_name\": \"f\", \"parameters\": {}}] tail", "f", "{}", "tail", 1},
    };
    check_call_cases(TOOL_FORMAT_COMMAND_R7B, "command-r7b", cases, sizeof cases / sizeof *cases);
    CHECK(tool_format_detect("{% if tools %}{{'" R_ACT "'}}{% endif %}") == TOOL_FORMAT_COMMAND_R7B,
          "the Command R7B template's marker detected");
    fprintf(stderr, "PASS command-r7b: %zu replies, every prefix\n", sizeof cases / sizeof *cases);
#undef R_ACT
#undef R_ACT_END
#undef R_RESP
#undef R_RESP_END
}


/* Qwen3-Coder's (and Qwen3.5's) calls (tool_glm.c tool_qwen_xml_call): the bodies their templates
 * write (a value between the newlines after <parameter=K> and before </parameter>; a string as it
 * is, a list or mapping as JSON, the rest through Jinja's `string`), parsed into JSON arguments;
 * read by the declared types when given (a string stays a string, Python's True and None are a
 * boolean and a null); malformed or cut-short bodies are text; calls without their <tool_call>
 * (from <function= to </function>) read too; every prefix. */
void check_qwen_xml(void)
{
#define Q_CALL(name) "<tool_call>\n<function=" name ">\n"
#define Q_ARG(k, v) "<parameter=" k ">\n" v "\n</parameter>\n"
#define Q_END "</function>\n</tool_call>"
    static const struct call_case cases[] = {
        {Q_CALL("get_weather") Q_ARG("city", "Paris") Q_END, "get_weather", "{\"city\":\"Paris\"}", "", 1},
        {"Let me check.\n\n" Q_CALL("f") Q_ARG("n", "42") Q_ARG("o", "{\"a\": [1, true]}") Q_END, "f",
         "{\"n\":42,\"o\":{\"a\": [1, true]}}", "Let me check.", 1},
        {Q_CALL("f") Q_ARG("s", "line one\n  say \"hi\"\n") Q_END, "f", "{\"s\":\"line one\\u000a  say \\\"hi\\\"\\u000a\"}", "", 1},
        {Q_CALL("noargs") Q_END, "noargs", "{}", "", 1},
        {Q_CALL("a") Q_ARG("x", "1") Q_END "\n" Q_CALL("b") Q_END " done", "a", "{\"x\":1}", "done", 2},
        {Q_CALL("f") Q_ARG("e", "") Q_END, "f", "{\"e\":\"\"}", "", 1},
        {Q_CALL("f") "<parameter=x>\n1\n" Q_END " tail", NULL, NULL, Q_CALL("f") "<parameter=x>\n1\n" Q_END " tail", 0},
        {Q_CALL("f") Q_ARG("x", "1"), NULL, NULL, Q_CALL("f") "<parameter=x>\n1\n</parameter>", 0}, /* (trimmed) */
        {"<tool_call>\n<function=two words>\n" Q_END, NULL, NULL, "<tool_call>\n<function=two words>\n" Q_END, 0},
        {"<tool_call>\nget_weather\n</tool_call>", NULL, NULL, "<tool_call>\nget_weather\n</tool_call>", 0},
        {Q_CALL("f") Q_ARG("t", "True") Q_ARG("z", "None") Q_END, "f", "{\"t\":\"True\",\"z\":\"None\"}", "", 1},
        {"plain text, no call", NULL, NULL, "plain text, no call", 0},
        /* without their <tool_call> (llama.cpp reads these too): from <function= to </function> */
        {"<function=get_weather>\n" Q_ARG("city", "Paris") "</function>", "get_weather", "{\"city\":\"Paris\"}", "", 1},
        {"Sure.\n<function=a>\n" Q_ARG("x", "1") "</function>\n<function=b>\n</function> ok", "a", "{\"x\":1}", "Sure. ok", 2},
        {"<function=a>\n</function>\n" Q_CALL("b") Q_END, "a", "{}", "", 2},
        {"<function=a>\n" Q_ARG("x", "1"), NULL, NULL, "<function=a>\n<parameter=x>\n1\n</parameter>", 0}, /* cut */
        {"<function=two words></function> x", NULL, NULL, "<function=two words></function> x", 0},
        {"a <function b", NULL, NULL, "a <function b", 0},
    };
    check_call_cases(TOOL_FORMAT_QWEN_XML, "qwen3-coder", cases, sizeof cases / sizeof *cases);
    /* The declared types: s a string (its JSON-looking value stays text), t a boolean, z a null. */
    static const char types[] = "\x1e" "f\x1fs\x1fs\x1e" "f\x1ft\x1f" "b\x1e" "f\x1fz\x1fz\x1e";
    static const char typed[] = Q_CALL("f") Q_ARG("s", "42") Q_ARG("t", "True") Q_ARG("z", "None") Q_ARG("n", "7") Q_END;
    struct tool_parsed p;
    CHECK(!tool_parse_typed(TOOL_FORMAT_QWEN_XML, 1, 0, 0, 0, types, typed, strlen(typed), 1, &p), "oom");
    CHECK(p.n_calls == 1 && !strcmp(p.calls[0].args, "{\"s\":\"42\",\"t\":true,\"z\":null,\"n\":7}"),
          "qwen3-coder typed: %s", p.n_calls ? p.calls[0].args : "(no call)");
    tool_parsed_free(&p);
    static const char glm[] = "<tool_call>f\n<arg_key>s</arg_key>\n<arg_value>42</arg_value>\n</tool_call>";
    CHECK(!tool_parse_typed(TOOL_FORMAT_GLM, 1, 0, 0, 0, types, glm, strlen(glm), 1, &p), "oom");
    CHECK(p.n_calls == 1 && !strcmp(p.calls[0].args, "{\"s\":\"42\"}"), "glm typed: %s", p.n_calls ? p.calls[0].args : "-");
    tool_parsed_free(&p);
    CHECK(tool_format_detect("{% if tools %}<tool_call>\n<function=x>\n<parameter=y>{% endif %}") == TOOL_FORMAT_QWEN_XML,
          "the Qwen3-Coder template's tags detected");
    CHECK(tool_format_detect("{% if tools %}<tool_call>{% endif %}") == TOOL_FORMAT_HERMES, "hermes still hermes");
    fprintf(stderr, "PASS qwen3-coder: %zu replies, every prefix; typed values\n", sizeof cases / sizeof *cases);
    /* Seed-OSS: Qwen's tags in <seed:tool_call>, a value as written (its newlines its own). */
#define S_CALL(name) "\n<seed:tool_call>\n<function=" name ">\n"
#define S_END "</function>\n</seed:tool_call>"
    static const struct call_case seed[] = {
        {S_CALL("get_weather") "<parameter=city>Paris</parameter>\n" S_END, "get_weather", "{\"city\":\"Paris\"}", "", 1},
        {"Checking." S_CALL("f") "<parameter=s>\nx\n</parameter>\n<parameter=n>42</parameter>\n" S_END, "f",
         "{\"s\":\"\\u000ax\\u000a\",\"n\":42}", "Checking.", 1},
        {S_CALL("a") S_END S_CALL("b") "<parameter=t>True</parameter>\n" S_END " done", "a", "{}", "done", 2},
        {S_CALL("f") "<parameter=x>1</parameter>\n", NULL, NULL, "<seed:tool_call>\n<function=f>\n<parameter=x>1</parameter>", 0},
        {"<tool_call>\n<function=f>\n</function>\n</tool_call>", NULL, NULL, "<tool_call>\n<function=f>\n</function>\n</tool_call>", 0},
    };
    check_call_cases(TOOL_FORMAT_SEED_OSS, "seed-oss", seed, sizeof seed / sizeof *seed);
    CHECK(tool_format_detect("{%- set toolcall_begin_token = '<seed:tool_call>' -%}{% if tools %}<function={% endif %}") == TOOL_FORMAT_SEED_OSS,
          "Seed-OSS's template detected");
    fprintf(stderr, "PASS seed-oss: %zu replies, every prefix\n", sizeof seed / sizeof *seed);
#undef S_CALL
#undef S_END
#undef Q_CALL
#undef Q_ARG
#undef Q_END
}

/* MiniMax-M2's block of <invoke>s (tool_glm.c tool_minimax_invoke): the shape its template writes
 * (values raw: a string as it is, the rest as JSON), several calls in one block, malformed or
 * cut-short blocks text; every prefix. */
void check_minimax(void)
{
#define M_OPEN "<minimax:tool_call>\n"
#define M_END "</minimax:tool_call>"
    static const struct call_case cases[] = {
        {"\n" M_OPEN "<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n</invoke>\n" M_END,
         "get_weather", "{\"city\":\"Paris\"}", "", 1},
        {"Checking.\n" M_OPEN "<invoke name=\"f\">\n<parameter name=\"n\">5</parameter>\n<parameter name=\"o\">{\"k\": [1, true]}"
         "</parameter>\n</invoke>\n<invoke name=\"g\">\n</invoke>\n" M_END " done", "f", "{\"n\":5,\"o\":{\"k\": [1, true]}}",
         "Checking. done", 2},
        {M_OPEN "<invoke name=\"f\"><parameter name=\"s\">two\nlines </p></parameter></invoke>" M_END, "f",
         "{\"s\":\"two\\u000alines </p>\"}", "", 1},
        {M_OPEN "<invoke name=\"f\">\n<parameter name=\"x\">1\n</invoke>\n" M_END, NULL, NULL,
         M_OPEN "<invoke name=\"f\">\n<parameter name=\"x\">1\n</invoke>\n" M_END, 0},
        {M_OPEN "<invoke name=\"f\">\n</invoke>\njunk" M_END, NULL, NULL, M_OPEN "<invoke name=\"f\">\n</invoke>\njunk" M_END, 0},
        {M_OPEN M_END, NULL, NULL, M_OPEN M_END, 0},
        {M_OPEN "<invoke name=\"f\">\n<parameter name=\"x\">1</parameter>", NULL, NULL,
         M_OPEN "<invoke name=\"f\">\n<parameter name=\"x\">1</parameter>", 0},
        {M_OPEN "<invoke name=\"two words\">\n</invoke>\n" M_END, NULL, NULL, M_OPEN "<invoke name=\"two words\">\n</invoke>\n" M_END, 0},
        /* cut inside the block (max_tokens): its whole calls kept, the rest dropped */
        {"Sure.\n" M_OPEN "<invoke name=\"f\">\n<parameter name=\"x\">1</parameter>\n</invoke>\n<invoke name=\"g\">\n<param",
         "f", "{\"x\":1}", "Sure.", 1},
    };
    check_call_cases(TOOL_FORMAT_MINIMAX, "minimax-m2", cases, sizeof cases / sizeof *cases);
    first_call_only(TOOL_FORMAT_MINIMAX, "minimax", cases[1].text, "f");
    CHECK(tool_format_detect("{% if tools %}<minimax:tool_call><invoke name=\"x\">{% endif %}") == TOOL_FORMAT_MINIMAX,
          "the MiniMax-M2 template's tags detected");
    fprintf(stderr, "PASS minimax-m2: %zu replies, every prefix\n", sizeof cases / sizeof *cases);
#undef M_OPEN
#undef M_END
}

/* Nemotron Nano v2's list (`<TOOLCALL>[{"name", "arguments"}, ...]</TOOLCALL>`, MISTRAL's list
 * between its markers): calls, text around them, malformed lists text; every prefix. */
void check_nemotron(void)
{
    static const struct call_case cases[] = {
        {"<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]</TOOLCALL>", "get_weather",
         "{\"city\": \"Paris\"}", "", 1},
        {"Let me check.\n<TOOLCALL>[{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"n\": [1]}}]</TOOLCALL>",
         "a", "{}", "Let me check.", 2},
        {"<TOOLCALL>[{\"name\": \"f\", \"arguments\": {\"x\": 1}}]", "f", "{\"x\": 1}", "", 1},
        {"<TOOLCALL>[{\"name\": \"f\", \"arguments\": {\"x\": 1}}]</TOOLCALL> after", "f", "{\"x\": 1}", "after", 1},
        {"<TOOLCALL>[{\"arguments\": {}}]</TOOLCALL>", NULL, NULL, "<TOOLCALL>[{\"arguments\": {}}]</TOOLCALL>", 0},
        {"<TOOLCALL>junk</TOOLCALL>", NULL, NULL, "<TOOLCALL>junk</TOOLCALL>", 0},
        {"no call <TOOLCAL", NULL, NULL, "no call <TOOLCAL", 0},
    };
    check_call_cases(TOOL_FORMAT_NEMOTRON, "nemotron", cases, sizeof cases / sizeof *cases);
    CHECK(tool_format_detect("{% if tools %}<TOOLCALL>[...]</TOOLCALL>{% endif %}") == TOOL_FORMAT_NEMOTRON,
          "the Nemotron Nano v2 template's markers detected");
    fprintf(stderr, "PASS nemotron: %zu replies, every prefix\n", sizeof cases / sizeof *cases);
}

/* DeepSeek V3.2's and V4's DSML blocks (MiniMax-M2's shape, each tag after ｜DSML｜, a parameter's
 * string="true|false" saying whether its value is raw or JSON): calls, text around them,
 * malformed blocks text; every prefix; V3.2's block is not V4's. */
void check_dsml(void)
{
#define D_BAR "\xef\xbd\x9c"
#define D_TAG "<" D_BAR "DSML" D_BAR
#define D_END "</" D_BAR "DSML" D_BAR
#define D_INVOKE(name) D_TAG "invoke name=\"" name "\">\n"
#define D_PARAM(k, s, v) D_TAG "parameter name=\"" k "\" string=\"" s "\">" v D_END "parameter>\n"
#define D_CALLS D_TAG "function_calls>\n"
#define D_CALLS_END D_END "function_calls>"
    static const struct call_case cases[] = {
        {"\n\n" D_CALLS D_INVOKE("get_weather") D_PARAM("city", "true", "Paris") D_PARAM("days", "false", "3") D_END "invoke>\n"
         D_CALLS_END, "get_weather", "{\"city\":\"Paris\",\"days\":3}", "", 1},
        /* a raw "42" stays a string; JSON that is not one whole value is read by llama.cpp's rule */
        {"Checking.\n\n" D_CALLS D_INVOKE("f") D_PARAM("s", "true", "42") D_PARAM("o", "false", "{\"k\": [1, true]}")
         D_PARAM("w", "false", "not json") D_END "invoke>\n" D_INVOKE("g") D_END "invoke>\n" D_CALLS_END " done", "f",
         "{\"s\":\"42\",\"o\":{\"k\": [1, true]},\"w\":\"not json\"}", "Checking. done", 2},
        {D_CALLS D_INVOKE("f") D_PARAM("s", "true", " two\nlines </p> ") D_END "invoke>" D_CALLS_END, "f",
         "{\"s\":\" two\\u000alines </p> \"}", "", 1},
        {D_CALLS D_INVOKE("f") D_TAG "parameter name=\"x\">1" D_END "parameter>\n" D_END "invoke>\n" D_CALLS_END, NULL, NULL,
         D_CALLS D_INVOKE("f") D_TAG "parameter name=\"x\">1" D_END "parameter>\n" D_END "invoke>\n" D_CALLS_END, 0},
        {D_CALLS D_INVOKE("f") D_PARAM("x", "maybe", "1") D_END "invoke>\n" D_CALLS_END, NULL, NULL,
         D_CALLS D_INVOKE("f") D_PARAM("x", "maybe", "1") D_END "invoke>\n" D_CALLS_END, 0},
        {D_CALLS D_CALLS_END, NULL, NULL, D_CALLS D_CALLS_END, 0},
        {D_CALLS D_INVOKE("f") D_TAG "parameter name=\"x\" string=\"false\">1" D_END "parameter>", NULL, NULL,
         D_CALLS D_INVOKE("f") D_TAG "parameter name=\"x\" string=\"false\">1" D_END "parameter>", 0},
        {D_TAG "tool_calls>\n" D_INVOKE("f") D_END "invoke>\n" D_END "tool_calls>", NULL, NULL,
         D_TAG "tool_calls>\n" D_INVOKE("f") D_END "invoke>\n" D_END "tool_calls>", 0},
        /* cut inside the block (max_tokens): its whole calls kept, the rest dropped */
        {"\n\n" D_CALLS D_INVOKE("f") D_PARAM("x", "false", "[1]") D_END "invoke>\n" D_INVOKE("f") D_PARAM("x", "true", "un"),
         "f", "{\"x\":[1]}", "", 1},
    };
    check_call_cases(TOOL_FORMAT_DSML, "deepseek-v3.2", cases, sizeof cases / sizeof *cases);
    first_call_only(TOOL_FORMAT_DSML, "deepseek-v3.2", cases[1].text, "f");
    static const struct call_case v4[] = {
        {"\n\n" D_TAG "tool_calls>\n" D_INVOKE("f") D_PARAM("n", "false", "-1.5e3") D_END "invoke>\n" D_END "tool_calls>", "f",
         "{\"n\":-1.5e3}", "", 1},
    };
    check_call_cases(TOOL_FORMAT_DSML_V4, "deepseek-v4", v4, 1);
    struct tool_parsed p;
    CHECK(!tool_parse(TOOL_FORMAT_DSML_V4, 1, 0, 0, 0, cases[0].text, strlen(cases[0].text), 1, &p), "oom");
    CHECK(p.n_calls == 0, "deepseek-v4: V3.2's function_calls block is text (%d calls)", p.n_calls);
    tool_parsed_free(&p);
    CHECK(tool_format_detect("{%- set dsml_token = '" D_BAR "DSML" D_BAR "' -%}{{ '<' + dsml_token + 'function_calls>' }}") ==
              TOOL_FORMAT_DSML,
          "DeepSeek V3.2's template detected");
    CHECK(tool_format_detect("{%- set dsml_token = '" D_BAR "DSML" D_BAR "' -%}{{ '<' + dsml_token + 'tool_calls>' }}") ==
              TOOL_FORMAT_DSML_V4,
          "DeepSeek V4's template detected");
    fprintf(stderr, "PASS deepseek-v3.2 / v4 (DSML): %zu + 1 replies, every prefix\n", sizeof cases / sizeof *cases);
#undef D_BAR
#undef D_TAG
#undef D_END
#undef D_INVOKE
#undef D_PARAM
#undef D_CALLS
#undef D_CALLS_END
}

/* Gemma 4's calls (tool_glm.c tool_gemma4_call): `<|tool_call>call:NAME{KEY:VALUE,...}<tool_call|>`
 * with its template's values (strings between <|"|> marks, bare keys at any depth, lists,
 * JSON numbers and words, Python's None); text around calls, parallel calls back to back,
 * malformed or cut-short calls text; every prefix; the detection by the template's text. */
void check_gemma4(void)
{
#define G_Q "<|\"|>"
#define G_CALL(body) "<|tool_call>call:" body "<tool_call|>"
    static const struct call_case cases[] = {
        {G_CALL("get_weather{city:" G_Q "Paris" G_Q "}"), "get_weather", "{\"city\":\"Paris\"}", "", 1},
        {"Checking." G_CALL("f{b:true,n:-1.5e3,o:{k:[1," G_Q "x" G_Q ",{z:None}]},s:" G_Q "42" G_Q "}") G_CALL("g{}") " done",
         "f", "{\"b\":true,\"n\":-1.5e3,\"o\":{\"k\":[1,\"x\",{\"z\":null}]},\"s\":\"42\"}", "Checking. done", 2},
        /* a string holds any bytes but the mark: quotes, newlines, braces, commas, '<' */
        {G_CALL("f{s:" G_Q "say \"hi\"\n{a,b}: <p>" G_Q "}"), "f", "{\"s\":\"say \\\"hi\\\"\\u000a{a,b}: <p>\"}", "", 1},
        /* the closing tag inside a string is the string's (the grammar lets a string hold it) */
        {G_CALL("f{s:" G_Q "a<tool_call|>b" G_Q ",t:" G_Q "<" G_Q "}") " x", "f", "{\"s\":\"a<tool_call|>b\",\"t\":\"<\"}", "x", 1},
        /* keys between marks (as its declarations write them), whitespace between tokens */
        {G_CALL("f{ " G_Q "k k" G_Q " : [ ] , m : { } }"), "f", "{\"k k\":[],\"m\":{}}", "", 1},
        {G_CALL("noargs{}"), "noargs", "{}", "", 1},
        /* malformed: a bare word, a JSON string, a trailing comma, no braces, junk after them, no name */
        {G_CALL("f{x:Paris}"), NULL, NULL, G_CALL("f{x:Paris}"), 0},
        {G_CALL("f{x:\"Paris\"}"), NULL, NULL, G_CALL("f{x:\"Paris\"}"), 0},
        {G_CALL("f{x:1,}"), NULL, NULL, G_CALL("f{x:1,}"), 0},
        {G_CALL("f"), NULL, NULL, G_CALL("f"), 0},
        {G_CALL("f{} x"), NULL, NULL, G_CALL("f{} x"), 0},
        {G_CALL("{}"), NULL, NULL, G_CALL("{}"), 0},
        {G_CALL("f{x:" G_Q "open}"), NULL, NULL, G_CALL("f{x:" G_Q "open}"), 0},
        /* cut short (max_tokens): text */
        {"<|tool_call>call:f{x:1", NULL, NULL, "<|tool_call>call:f{x:1", 0},
        {"plain text, no call", NULL, NULL, "plain text, no call", 0},
    };
    check_call_cases(TOOL_FORMAT_GEMMA4, "gemma4", cases, sizeof cases / sizeof *cases);
    first_call_only(TOOL_FORMAT_GEMMA4, "gemma4", cases[1].text, "f");
    CHECK(tool_format_detect("{%- if tools -%}{{- '<|tool_call>call:' + function['name'] + '{' -}}{%- endif -%}") ==
              TOOL_FORMAT_GEMMA4,
          "Gemma 4's template detected");
    fprintf(stderr, "PASS gemma4: %zu replies, every prefix\n", sizeof cases / sizeof *cases);
#undef G_Q
#undef G_CALL
}

/* functionary v3.1's calls (tool_glm.c tool_functionary_call): `<function=NAME>{...}</function>`, back
 * to back; text around them; malformed or cut-short calls text; every prefix; the detection by
 * the template's text (before Llama 3's, whose headers it shares). */
void check_functionary(void)
{
    static const struct call_case cases[] = {
        {"<function=get_weather>{\"city\": \"Paris\"}</function>", "get_weather", "{\"city\": \"Paris\"}", "", 1},
        {"Checking. <function=f>{\"a\": [1, {\"b\": null}], \"s\": \"x</p>\"}</function><function=g>{}</function> done",
         "f", "{\"a\": [1, {\"b\": null}], \"s\": \"x</p>\"}", "Checking. done", 2},
        {"<function=f> {\"x\": 1} </function>", "f", "{\"x\": 1}", "", 1},
        {"<function=f>[1]</function>", NULL, NULL, "<function=f>[1]</function>", 0},
        {"<function=f>{\"x\": tru}</function>", NULL, NULL, "<function=f>{\"x\": tru}</function>", 0},
        {"<function=>{}</function>", NULL, NULL, "<function=>{}</function>", 0},
        {"<function=a b>{}</function>", NULL, NULL, "<function=a b>{}</function>", 0},
        /* the reply's end closes a whole call (its schema lets the model stop after the arguments) */
        {"<function=f>{\"x\": 1} ", "f", "{\"x\": 1}", "", 1},
        {"<function=a>{}</function><function=f>{\"x\": 1}", "a", "{}", "", 2},
        {"<function=f>{\"x\": 1", NULL, NULL, "<function=f>{\"x\": 1", 0},
        {"plain text, no call", NULL, NULL, "plain text, no call", 0},
    };
    check_call_cases(TOOL_FORMAT_FUNCTIONARY, "functionary", cases, sizeof cases / sizeof *cases);
    first_call_only(TOOL_FORMAT_FUNCTIONARY, "functionary", cases[1].text, "f");
    CHECK(tool_format_detect("{{ '<|start_header_id|>' }}{% if tools %}{{ 'ipython' }}{{ '<function=' + name + '>' }}{% endif %}") ==
              TOOL_FORMAT_FUNCTIONARY,
          "functionary v3.1's template detected");
    fprintf(stderr, "PASS functionary: %zu replies, every prefix\n", sizeof cases / sizeof *cases);
}
