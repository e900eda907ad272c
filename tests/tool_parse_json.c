/* tests/tool_parse_json.c - the reply parser (server/tool_format.h tool_parse) as a command for
 * Python tests: reads a reply on stdin, parses it whole (final) as a reply to a request with
 * tools in the format named by argv[1], and prints {"content", "reasoning", "calls": [{"name",
 * "arguments"}]} as JSON. Driven by tests/test_tool_builtin.py and tests/test_harmony.py.
 * Usage: tool_parse_json FORMAT [reasoning] [notools] < reply (notools: a request without tools) */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool_format.h"

int main(int argc, char **argv)
{
    enum tool_format f = TOOL_FORMAT_GENERIC;
    int found = 0;
    for (int k = 0; argc > 1 && k <= TOOL_FORMAT_HARMONY && !found; k++)
        if (!strcmp(argv[1], tool_format_name((enum tool_format)k))) f = (enum tool_format)k, found = 1;
    if (!found) {
        fprintf(stderr, "usage: tool_parse_json FORMAT [reasoning] [notools] < reply (FORMAT: generic, hermes, mistral, "
                        "llama3, phi4, harmony)\n");
        return 2;
    }
    size_t n = 0, cap = 4096;
    char *text = malloc(cap);
    for (size_t got; text && (got = fread(text + n, 1, cap - n, stdin)) > 0;) {
        n += got;
        if (n == cap) text = realloc(text, cap *= 2);
    }
    struct tool_parsed p;
    int reasoning = 0, tools = 1;
    for (int i = 2; i < argc; i++) reasoning |= !strcmp(argv[i], "reasoning"), tools &= !!strcmp(argv[i], "notools");
    if (!text || tool_parse(f, tools, reasoning, 0, 0, text, n, 1, &p)) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    cJSON *o = cJSON_CreateObject(), *calls = cJSON_AddArrayToObject(o, "calls");
    cJSON_AddStringToObject(o, "content", p.content);
    cJSON_AddStringToObject(o, "reasoning", p.reasoning);
    for (int k = 0; k < p.n_calls; k++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "name", p.calls[k].name);
        cJSON_AddStringToObject(c, "arguments", p.calls[k].args);
        cJSON_AddBoolToObject(c, "complete", p.calls[k].complete);
        cJSON_AddItemToArray(calls, c);
    }
    char *s = cJSON_PrintUnformatted(o);
    printf("%s\n", s);
    free(s);
    cJSON_Delete(o);
    tool_parsed_free(&p);
    free(text);
    return 0;
}
