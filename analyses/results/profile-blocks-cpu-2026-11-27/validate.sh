cd /work/e3big
for B in 4 1; do
  /usr/bin/time -f "%e s wall, %U s user, %S s system" /work/main/.venv/bin/specsim validate eval.h5 --draft eagle3:head --tree chain:2 --tree chain:4 --batch $B --cost-profile /work/prof47/new2.json --threads 2 --quiet --out /work/prof47/validate_new2_b$B.csv > /work/prof47/validate_new2_b$B.txt 2> /work/prof47/validate_new2_b$B.log
  uptime >> /work/prof47/validate_new2_b$B.txt
done
