/* engine/formats/config_json.c - the typed config.json field readers (config_impl.h).
 * Tests: tests/test_formats.c (config errors). */
#include "config_impl.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* The item for key, or NULL when it is absent or JSON null (optional fields treat both as
 * "use the default"). */
const cJSON *config_field(const cJSON *root, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    return (it && !cJSON_IsNull(it)) ? it : NULL;
}

enum status config_missing(const cJSON *root, const char *name, const char *key)
{
    if (cJSON_GetObjectItemCaseSensitive(root, key))
        return status_errorf(STATUS_BAD_FORMAT, "%s: field '%s' is null", name, key);
    return status_errorf(STATUS_BAD_FORMAT, "%s: missing field '%s'", name, key);
}

enum status config_json_to_int(const cJSON *it, const char *name, const char *key, int *out)
{
    if (!cJSON_IsNumber(it))
        return status_errorf(STATUS_BAD_FORMAT, "%s: field '%s' must be an integer", name, key);
    double d = it->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < (double)INT_MIN || d > (double)INT_MAX)
        return status_errorf(STATUS_BAD_FORMAT, "%s: field '%s' = %g is not a 32-bit integer",
                             name, key, d);
    *out = (int)d;
    return STATUS_OK;
}

/* Reads an integer field; absent or null gives dflt, or an error when required. */
enum status config_get_int(const cJSON *root, const char *name, const char *key, int required,
                           int dflt, int *out)
{
    const cJSON *it = config_field(root, key);
    if (!it) {
        if (required) return config_missing(root, name, key);
        *out = dflt;
        return STATUS_OK;
    }
    return config_json_to_int(it, name, key, out);
}

enum status config_get_float(const cJSON *root, const char *name, const char *key, float dflt,
                             float *out)
{
    const cJSON *it = config_field(root, key);
    if (!it) {
        *out = dflt;
        return STATUS_OK;
    }
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return status_errorf(STATUS_BAD_FORMAT, "%s: field '%s' must be a finite number", name,
                             key);
    *out = (float)it->valuedouble;
    return STATUS_OK;
}

enum status config_get_bool(const cJSON *root, const char *name, const char *key, int dflt,
                            int *out)
{
    const cJSON *it = config_field(root, key);
    if (!it) {
        *out = dflt;
        return STATUS_OK;
    }
    if (!cJSON_IsBool(it))
        return status_errorf(STATUS_BAD_FORMAT, "%s: field '%s' must be true or false", name, key);
    *out = cJSON_IsTrue(it) ? 1 : 0;
    return STATUS_OK;
}

/* Optional string field: *out is NULL when absent or null. */
enum status config_get_string(const cJSON *root, const char *name, const char *key,
                              const char **out)
{
    const cJSON *it = config_field(root, key);
    *out = NULL;
    if (!it) return STATUS_OK;
    if (!cJSON_IsString(it))
        return status_errorf(STATUS_BAD_FORMAT, "%s: field '%s' must be a string", name, key);
    *out = it->valuestring;
    return STATUS_OK;
}

enum status config_get_activation(const char *name, const char *key, const char *s,
                                  enum activation *out)
{
    if (!strcmp(s, "silu") || !strcmp(s, "swish")) *out = ACTIVATION_SILU;
    else if (!strcmp(s, "gelu_new") || !strcmp(s, "gelu_pytorch_tanh")) *out = ACTIVATION_GELU_TANH;
    else if (!strcmp(s, "gelu")) *out = ACTIVATION_GELU_ERF;
    else
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: field '%s' = \"%s\" is not supported (silu, gelu_new, "
                             "gelu_pytorch_tanh, gelu)",
                             name, key, s);
    return STATUS_OK;
}
