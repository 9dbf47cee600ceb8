/*
 * From a kernel's mangled name to the name expression that instantiates it
 * in a hot build. The program launches scale<float>, which the driver calls
 * _Z5scaleIfEvPT_S0_i; NVRTC compiles a template instantiation only when
 * one is named (nvrtcAddNameExpression), and then gives it the same mangled
 * name nvcc did, since both follow the Itanium C++ ABI.
 *
 * The demangling is libstdc++'s (__cxa_demangle, the C entry point of its
 * demangler): "void scale<float>(float*, float, int)". What is read here is
 * only the outline of that text: the parameter list is the last group in
 * parentheses at depth 0, the function's name the last token before it at
 * depth 0 (a function template's demangled name begins with its return
 * type), and the name is a template when it ends in a template argument
 * list. The result, "scale<float>" or "ns::scale<float, 2>", names the
 * instantiation; an overloaded template would need a cast, which is not
 * attempted.
 */
#include <stdlib.h>
#include <string.h>

#include "interpose/interpose.h"

/* libstdc++'s demangler (cxxabi.h declares it in C++; it has C linkage). */
char *__cxa_demangle(const char *mangled, char *buf, size_t *len, int *status);

char *hki_name_expression(const char *name) {
    if (!name || strncmp(name, "_Z", 2))
        return NULL; /* a C name */
    int status = 0;
    char *d = __cxa_demangle(name, NULL, NULL, &status);
    if (!d || status != 0) {
        free(d);
        return NULL;
    }
    /* The parameter list: the last '(' at depth 0 (depth counts <> and ()). */
    size_t n = strlen(d);
    long open = -1;
    int angle = 0, paren = 0;
    for (size_t i = 0; i < n; i++) {
        char c = d[i];
        if (c == '<')
            angle++;
        else if (c == '>' && angle)
            angle--;
        else if (c == '(') {
            if (!angle && !paren)
                open = (long)i;
            paren++;
        } else if (c == ')' && paren)
            paren--;
    }
    char *out = NULL;
    if (open > 0 && d[open - 1] == '>') {
        /* Back over the name's template arguments, then its identifier and
         * qualifiers, up to a space at depth 0 (the return type's end). */
        long end = open, i = open - 1;
        angle = 0;
        for (; i >= 0; i--) {
            char c = d[i];
            if (c == '>')
                angle++;
            else if (c == '<')
                angle--;
            else if (c == ' ' && !angle)
                break;
        }
        long start = i + 1;
        if (end > start && !angle)
            out = strndup(d + start, (size_t)(end - start));
    }
    free(d);
    return out;
}
