// trident: one command with subcommands (preprocess, train, generate, ...).
int main() { return 0; }
