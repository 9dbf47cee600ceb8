/*
 * The hotkern command-line tool: one entry function per subcommand.
 * Each takes the arguments after the subcommand name (argv[0] is the
 * subcommand) and returns the process exit status: 0 success, 1 the operation
 * was refused or failed (compile error, refused push ...), 2 usage error.
 */
#ifndef HK_CLI_H
#define HK_CLI_H

int hkc_cmd_check(int argc, char **argv);    /* cli/check.c */
int hkc_cmd_keygen(int argc, char **argv);   /* cli/net_cmds.c */
int hkc_cmd_sign(int argc, char **argv);     /* cli/net_cmds.c (alias publish) */
int hkc_cmd_push(int argc, char **argv);     /* cli/net_cmds.c */
int hkc_cmd_status(int argc, char **argv);   /* cli/net_cmds.c */
int hkc_cmd_rollback(int argc, char **argv); /* cli/net_cmds.c */
int hkc_cmd_pull(int argc, char **argv);     /* cli/net_cmds.c */

#endif
