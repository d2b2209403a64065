from raygrpo.sandbox.fake_provider.service import main

main()
