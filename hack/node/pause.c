/* The pod sandbox's process: holds the pod's namespaces, reaps orphans (it is PID 1 when the pod
 * shares its PID namespace) and exits on SIGINT/SIGTERM. Built static, shipped in an image FROM scratch. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("rft-pause 1.0");
        return 0;
    }
    struct sigaction term = {0}, child = {0};
    term.sa_handler = on_term;
    child.sa_handler = on_child;
    child.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
        sigaction(SIGCHLD, &child, NULL) < 0) {
        perror("sigaction");
        return 1;
    }
    for (;;)
        pause();
}
